"""Bad configs, one of each kind, shared by the in-process CLI tests (tests/unit/test_config.py)
and the fresh-interpreter ones (tests/integration/test_cli_errors.py)."""

import textwrap

GOOD = textwrap.dedent("""
    data: {name: digits}
    model: {name: mlp, norm: none}
    batch: {size: 32, max_local_batch: 16}
    scaling: {min_workers: 1, max_workers: 2}
""")

# (yaml text or None for GOOD, overrides, expected message fragment)
CASES = {
    "unknown_key": (
        None,
        ["batch.sizee=3"],
        "batch.sizee: unknown key; did you mean batch.size? (allowed keys here: size, max_local_batch",
    ),
    "unknown_section": (None, ["optimiser.lr=1"], "optimiser: unknown key; did you mean optimizer?"),
    "unknown_key_far": (
        None,
        ["batch.zzz=3"],
        "batch.zzz: unknown key; remove it or use one of the keys allowed here: size, max_local_batch",
    ),
    "wrong_type": (None, ["batch.size=abc"], "batch.size: expects an integer, got the string"),
    "zero_batch": (None, ["batch.size=0"], "batch.size: must be > 0 (got 0); set a value > 0 such as 64"),
    "negative_batch": (None, ["batch.size=-4"], "batch.size: must be > 0 (got -4)"),
    "mapping_for_params": (None, ["model.params=3"], "model.params: expects a mapping (got 3); write key: value pairs"),
    "params_of_a_builtin": (None, ["model.params={a: 1}"], "model.params: has no effect unless model.factory is given"),
    "set_without_equals": (None, ["batch.size"], "--set batch.size: expected KEY=VALUE; write --set batch.size=VALUE"),
    "bn_one_sample_micro_batches": (
        None,
        ["model.norm=batch", "batch.max_local_batch=1"],
        "batch.max_local_batch: 1 puts one sample through the model at a time, and model "
        "mlp's BatchNorm cannot train on one sample (layer 2 would see one value per "
        "channel); set batch.max_local_batch to at least 2, or model.norm: group",
    ),
    "min_above_max_workers": (None, ["scaling.min_workers=3"], "scaling.min_workers: 3 is above scaling.max_workers 2"),
    "unknown_model": (
        None,
        ["model.name=vgg"],
        "model.name: unknown 'vgg'; expected one of mlp, cnn, resnet18, resnet50",
    ),
    "unknown_dataset": (
        None,
        ["data.name=mnist"],
        "data.name: unknown 'mnist'; expected one of digits, synthetic, cifar10",
    ),
    "unknown_optimizer": (None, ["optimizer.name=rmsprop"], "optimizer.name: unknown 'rmsprop'"),
    "missing_cifar_root": (
        None,
        ["data.name=cifar10", "data.root=/nonexistent/cifar"],
        "data.root: no CIFAR-10 at '/nonexistent/cifar/cifar-10-batches-py'",
    ),
    "cifar_without_root": (None, ["data.name=cifar10"], "data.root: required for cifar10"),
    "unreadable_yaml": ("data: {name: digits\nmodel: [", [], "is not valid YAML at line"),
    "not_a_mapping": ("- 1\n- 2\n", [], "must be a mapping of sections"),
    "sync_bn_on_cpu": (None, ["model.sync_bn=true"], "model.sync_bn: PyTorch's SyncBatchNorm runs on GPUs only"),
    "storage_uri_scheme": (
        None,
        ["checkpoint.storage_path=ftp://host/runs"],
        "checkpoint.storage_path: unknown URI scheme 'ftp://'; give a folder or a URI of one of s3://",
    ),
    "storage_uri_credentials": (
        None,
        ["checkpoint.storage_path=s3://AKIA:hunter2@bucket/runs"],
        "checkpoint.storage_path: a URI with credentials (s3://***@...) is not accepted",
    ),
    "keep_one": (None, ["checkpoint.keep=1"], "checkpoint.keep: 1 leaves no older checkpoint to fall back to"),
    # one case of each class of bad input (all fields of each: tests/unit/test_config_classes.py)
    "non_finite": (None, ["optimizer.lr=.inf"], "optimizer.lr: must be a finite number"),
    "bool_for_int": (None, ["batch.size=true"], "batch.size: expects an integer, got the boolean true"),
    "int_for_bool": (None, ["scaling.use_gpu=1"], "scaling.use_gpu: expects true or false"),
    "duplicate_key": (GOOD + "batch: {size: 64}\n", [], "batch: given twice"),
    "batch_above_dataset": (None, ["data.val_fraction=0.99"], "batch.size: 32 is above the 18 training samples"),
    "no_effect": (None, ["schedule.poly_power=3"], "schedule.poly_power: has no effect unless schedule.decay is poly"),
    "bad_shape": (
        None,
        ["data.name=synthetic", "data.shape=[64]", "model.name=cnn"],
        "data.shape: model cnn cannot take inputs of shape [64]",
    ),
    "empty_storage": (None, ["checkpoint.storage_path=''"], "checkpoint.storage_path: empty"),
    "missing_tracking_folder": (None, ["tracking.uri=sqlite:///nowhere/mlflow.db"], "tracking.uri: sqlite:///nowhere"),
    "empty_experiment": (None, ["tracking.experiment=''"], "tracking.experiment: empty"),
    # the GPU fast path's options against the resources
    "data_on_accelerator_without_gpu": (
        None,
        ["data.device=accelerator"],
        "data.device: accelerator keeps the dataset on the GPU and needs scaling.use_gpu: true",
    ),
    "channels_last_on_mlp": (
        None,
        ["model.channels_last=true"],
        "model.channels_last: mlp has no Conv2d layer (not a 4-D image model)",
    ),
    "fp16_on_cpu": (None, ["train.precision=fp16"], "train.precision: fp16 needs a CUDA GPU"),
    "val_split_test_on_digits": (
        None,
        ["data.val_split=test"],
        "data.val_split: test needs a dataset with an official test set (cifar10)",
    ),
    "augment_text": (
        None,
        ["data.name=text", "model.name=lstm", "data.augment=[hflip]"],
        "data.augment: hflip need image inputs shaped [C, H, W]",
    ),
    # what a gradient-combination method cannot honour (each method class's check, trainers/combine/combinations.py)
    "unknown_combine": (
        None,
        ["combine.method=sum"],
        "combine.method: unknown 'sum'; expected one of mean, adasum, local_sgd, dmsgd, decentlam",
    ),
    "local_steps_zero": (
        None,
        ["combine.method=local_sgd", "combine.local_steps=0"],
        "combine.local_steps: must be >= 1 (got 0)",
    ),
    "adasum_scaled_lr": (
        None,
        ["combine.method=adasum", "scaling.min_workers=2"],
        "schedule.scaling_rule: 'linear' cannot be used with combine.method adasum",
    ),
    "adasum_elastic": (
        None,
        ["combine.method=adasum", "schedule.scaling_rule=none"],
        "scaling.min_workers: 1 differs from scaling.max_workers 2; combine.method adasum needs a fixed worker count",
    ),
    "fp16_with_local_sgd": (
        None,
        ["scaling.use_gpu=true", "train.precision=fp16", "combine.method=local_sgd", "combine.local_steps=2"],
        "train.precision: fp16 cannot be used with combine.method local_sgd",
    ),
    "local_sgd_noise_scale": (
        None,
        ["combine.method=local_sgd", "combine.local_steps=4", "batch.policy=noise_scale"],
        "batch.policy: 'noise_scale' cannot be used with combine.method local_sgd",
    ),
    "decentlam_one_worker": (
        None,
        ["combine.method=decentlam"],
        "scaling.min_workers: 1; combine.method decentlam needs at least 2 workers",
    ),
    "dmsgd_adam": (
        None,
        ["combine.method=dmsgd", "scaling.min_workers=2", "optimizer.name=adam"],
        "optimizer.name: 'adam' cannot be used with combine.method dmsgd",
    ),
    "topology_without_decentral": (
        None,
        ["combine.topology=ring"],
        "combine.topology: only used by combine.method dmsgd or decentlam",
    ),
    "decentlam_bad_topology": (
        None,
        ["combine.method=decentlam", "scaling.min_workers=2", "combine.topology=star"],
        "combine.topology: unknown 'star'; expected one of ring, exponential",
    ),
}


def _write(tmp_path, text):
    p = tmp_path / "cfg.yaml"
    p.write_text(GOOD if text is None else text)
    return str(p)
