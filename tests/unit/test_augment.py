import numpy as np
import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError

from trainers.data.augment import (
    _STREAM_COL,
    _STREAM_FLIP,
    _STREAM_ROW,
    AUGMENTS,
    Augment,
    hflip,
    random_bits,
    random_crop,
    uniform_ints,
)
from trainers.data.config import AUGMENT_NAMES, AugmentConfig, parse_augment
from trainers.data.order import micro_batches, slice_bounds


def _images(n=30, side=8, dtype=torch.uint8):
    g = torch.Generator().manual_seed(3)
    if dtype == torch.uint8:
        return torch.randint(0, 256, (n, 3, side, side), dtype=torch.uint8, generator=g)
    return torch.randn(n, 3, side, side, generator=g)


def test_same_sample_same_epoch_same_augmentation_across_ranks_and_micro_batches():
    aug = Augment(["random_crop", "hflip"], seed=7)
    ids = np.random.default_rng(0).permutation(200)[:30]  # a global batch of the epoch's order
    x_all = _images(200)
    whole = aug(x_all[ids], ids, epoch=2)
    parts = []
    for rank in range(3):  # W=3, each rank's slice in micro-batches of at most 4
        lo, hi = slice_bounds(len(ids), rank, 3)
        for mb in micro_batches(ids[lo:hi], 4):
            parts.append(aug(x_all[mb], torch.as_tensor(mb), epoch=2))
    assert torch.equal(torch.cat(parts), whole)
    # a resume: a fresh object, another global RNG state, the same samples
    torch.manual_seed(12345)
    rng_before = torch.get_rng_state()
    again = Augment(["random_crop", "hflip"], seed=7)(x_all[ids[5:9]], ids[5:9], epoch=2)
    assert torch.equal(again, whole[5:9])
    assert torch.equal(torch.get_rng_state(), rng_before)  # no global RNG drawn


def test_randomness_depends_on_seed_epoch_and_id():
    ids = torch.arange(1000)
    base = random_bits(0, 0, ids, _STREAM_FLIP)
    assert not torch.equal(base, random_bits(1, 0, ids, _STREAM_FLIP))
    assert not torch.equal(base, random_bits(0, 1, ids, _STREAM_FLIP))
    assert not torch.equal(base, random_bits(0, 0, ids, _STREAM_ROW))
    assert torch.equal(base, random_bits(0, 0, ids, _STREAM_FLIP))
    assert int(base.min()) >= 0 and int(base.max()) < 2**32
    assert len(torch.unique(base)) > 990


def test_crops_stay_in_bounds_and_equal_the_padded_window():
    x = _images(64, side=6)
    ids = torch.arange(100, 164)
    out = random_crop(x, ids, seed=1, epoch=3, padding=4)
    assert out.shape == x.shape and out.dtype == torch.uint8
    dy = uniform_ints(1, 3, ids, _STREAM_ROW, 9)
    dx = uniform_ints(1, 3, ids, _STREAM_COL, 9)
    assert int(dy.min()) >= 0 and int(dy.max()) <= 8 and int(dx.min()) >= 0 and int(dx.max()) <= 8
    padded = F.pad(x, (4, 4, 4, 4))
    for i in range(len(ids)):
        a, b = int(dy[i]), int(dx[i])
        assert torch.equal(out[i], padded[i, :, a : a + 6, b : b + 6])


def test_crop_offsets_cover_the_range_evenly():
    counts = torch.bincount(uniform_ints(0, 0, torch.arange(9000), _STREAM_ROW, 9), minlength=9)
    assert len(counts) == 9 and int(counts.min()) > 850 and int(counts.max()) < 1150


def test_flips_are_about_half_and_are_mirror_images():
    n = 4000
    x = _images(n, side=4, dtype=torch.float32)
    ids = torch.arange(n)
    out = hflip(x, ids, seed=5, epoch=0)
    flipped = (out == x.flip(-1)).flatten(1).all(1)
    kept = (out == x).flatten(1).all(1)
    assert bool((flipped | kept).all())
    assert 0.46 < float(flipped.float().mean()) < 0.54


def test_unknown_augmentation_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"^data\.augment: unknown 'rotate'; expected one of random_crop, hflip"):
        parse_augment(["hflip", "rotate"])
    with pytest.raises(ValidationError, match=r"data\.augment: unknown 'rotate'"):
        AugmentConfig(augment=["rotate"])
    with pytest.raises(ValueError, match="listed twice"):
        parse_augment(["hflip", "hflip"])
    assert AugmentConfig(augment=["random_crop", "hflip"]).augment == ["random_crop", "hflip"]
    assert Augment.from_config(AugmentConfig(), seed=0) is None
    assert tuple(AUGMENTS) == AUGMENT_NAMES  # the config's names (torch-free) are the functions' keys


def test_random_crop_refuses_non_image_batches():
    with pytest.raises(ValueError, match="4-D"):
        random_crop(torch.zeros(3, 5), torch.arange(3), 0, 0)
