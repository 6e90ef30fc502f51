"""docs/configuration.md is generated from the config classes (docs/gen_config_reference.py): it must
match them, and every field must say what it does, so the reference never lags the code."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from pydantic import BaseModel

from orchestrator.config.schema import RootConfig

ROOT = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("gen_config_reference", ROOT / "docs" / "gen_config_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fields(cls: type[BaseModel], prefix: str = ""):
    for name, field in cls.model_fields.items():
        yield f"{prefix}{name}", field
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            yield from _fields(field.annotation, f"{prefix}{name}.")


def test_docs_configuration_md_is_what_the_classes_generate():
    current = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert current == _generator().render(), (
        "docs/configuration.md is stale: run python docs/gen_config_reference.py and commit the result"
    )


def test_every_config_key_has_a_row_with_its_default_and_a_description():
    text = _generator().render()
    keys = [key for key, _ in _fields(RootConfig)]
    assert len(keys) > 90
    sections = set(RootConfig.model_fields)  # described by their class's docstring
    undescribed = [
        key for key, field in _fields(RootConfig) if key not in sections and not (field.description or "").strip()
    ]
    assert not undescribed, f"give these fields a Field(description=...): {', '.join(undescribed)}"
    for key in keys:
        assert (f"## {key}\n" if key in sections else f"| `{key}` |") in text, key
    assert "| `batch.size` | int > 0 | `64` |" in text
    assert "| `scaling.resize_mode` | overlap \\| restart | `overlap` |" in text
    assert "| `tracking.uri` | str \\| null | `null` |" in text


def test_check_mode_reports_a_stale_file(tmp_path, capsys):
    gen = _generator()
    stale = tmp_path / "configuration.md"
    stale.write_text("# Configuration reference\n")
    assert gen.main(["--check", "--output", str(stale)]) == 1
    assert "stale; regenerate with: python docs/gen_config_reference.py" in capsys.readouterr().err
    assert gen.main(["--output", str(stale)]) == 0
    assert gen.main(["--check", "--output", str(stale)]) == 0
