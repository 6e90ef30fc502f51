"""Build ``.whl/site312.tar.xz``: what a lent GPU machine needs to run this project and lacks.

The device tool's machines (docs/benchmarks.md "On a GPU") run Python 3.12 with torch, numpy, scipy,
pandas, matplotlib, scikit-learn and many more, but no Ray, MLflow or Optuna, and cannot reach a
package registry.  This downloads CPython 3.12 manylinux wheels of the project's pinned Ray, MLflow
and Optuna (the versions in this environment) and everything they need, leaves out every project the
image already holds (``IMAGE``, as the workplace listed it on 2026-11-17), unpacks the rest into one
folder, removes what training never imports (Ray's Java jars, RLlib, Serve, the dashboard's source
maps, Plotly, MLflow's UI build, bytecode caches) and packs it as one xz archive (~46 MB: the tool
carries 64 MiB with the working tree).  On the machine it is unpacked onto ``PYTHONPATH``: the
command line is in bench/gpu_checks.py's docstring; carry it with ``carry: [".whl"]``.

    .venv/bin/python scripts/pack_device_site.py            # ~3 min, ~300 MB of downloads
    .venv/bin/python scripts/pack_device_site.py --out /tmp/site312.tar.xz --keep /tmp/site

``.whl/`` is meant to stay out of git (add ``/.whl/`` to ``.git/info/exclude``).
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from importlib import metadata

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The image's Python projects (/work/.library/device/KINDS.md, "Python packages already there", 2026-11-17).
IMAGE = """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt
jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities
linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes
mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba
numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse
nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx
onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client
propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions
pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl
tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics
torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop
wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp""".split()

# What training on the machine never imports (relative to the unpacked folder; py-spy and virtualenv: Ray's
# dashboard profiler and runtime environments).
PRUNE_DIRS = ("ray/jars", "ray/rllib", "ray/serve", "mlflow/server/js", "plotly", "_plotly_utils", "virtualenv")
PRUNE_GLOBS = ("py_spy-*.data",)
PRUNE_SUFFIXES = (".map",)


def norm(name: str) -> str:
    """A project's name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_project(filename: str) -> str:
    return norm(os.path.basename(filename).split("-")[0])


def versions() -> dict[str, str]:
    return {name: metadata.version(name) for name in ("ray", "mlflow", "optuna")}


def download(dest: str, pins: dict[str, str]) -> None:
    reqs = [f"ray[default,train]=={pins['ray']}", f"mlflow=={pins['mlflow']}", f"optuna=={pins['optuna']}"]
    reqs += ["pydantic>=2.6,<3"]
    platforms = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version", "3.12"]
    cmd += ["--implementation", "cp", "--abi", "cp312", "--abi", "abi3", "--abi", "none"]
    cmd += [x for p in platforms for x in ("--platform", p)] + ["-d", dest, *reqs]
    subprocess.run(cmd, check=True)


def unpack(wheels: str, site: str) -> list[str]:
    """Unzip every wheel whose project the image lacks into ``site``; the projects unpacked."""
    image = {norm(n) for n in IMAGE}
    kept = []
    for name in sorted(os.listdir(wheels)):
        if not name.endswith(".whl") or wheel_project(name) in image:
            continue
        with zipfile.ZipFile(os.path.join(wheels, name)) as z:
            z.extractall(site)
            for info in z.infolist():  # extractall drops the mode: Ray's gcs_server and raylet must stay executable
                mode = info.external_attr >> 16
                if mode & 0o111 and not info.is_dir():
                    os.chmod(os.path.join(site, info.filename), mode & 0o777)
        kept.append(wheel_project(name))
    return kept


def prune(site: str) -> None:
    for rel in PRUNE_DIRS:
        shutil.rmtree(os.path.join(site, rel), ignore_errors=True)
    for pattern in PRUNE_GLOBS:
        for path in glob.glob(os.path.join(site, pattern)):
            shutil.rmtree(path)
    for dirpath, dirnames, filenames in os.walk(site):
        if "__pycache__" in dirnames:
            shutil.rmtree(os.path.join(dirpath, "__pycache__"))
            dirnames.remove("__pycache__")
        for f in filenames:
            if f.endswith(PRUNE_SUFFIXES):
                os.remove(os.path.join(dirpath, f))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, ".whl", "site312.tar.xz"))
    ap.add_argument("--keep", help="unpack into this folder and keep it (default: a temporary one)")
    a = ap.parse_args(argv)
    pins = versions()
    with tempfile.TemporaryDirectory(prefix="device-site-") as tmp:
        wheels = os.path.join(tmp, "wheels")
        site = a.keep or os.path.join(tmp, "site")
        os.makedirs(site, exist_ok=True)
        print(f"downloading CPython 3.12 wheels of {pins} and their needs", flush=True)
        download(wheels, pins)
        kept = unpack(wheels, site)
        prune(site)
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        tar = subprocess.Popen(["tar", "-C", site, "-cf", "-", "."], stdout=subprocess.PIPE)
        with open(a.out, "wb") as f:
            subprocess.run(["xz", "-T2", "-6"], stdin=tar.stdout, stdout=f, check=True)
        if tar.wait() != 0:
            print("tar failed", file=sys.stderr)
            return 1
    size = os.path.getsize(a.out) / 2**20
    print(f"{a.out}: {size:.1f} MiB, {len(kept)} projects the image lacks: {' '.join(kept)}")
    if size > 60:
        print("warning: over 60 MiB; the device tool carries 64 MiB with the working tree", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
