"""search.study_storage: how a storage is named, shown and opened (journal files and RDB URLs)."""

from __future__ import annotations

import pytest

from orchestrator.config.schema import ConfigError
from search.study_storage import describe_storage, is_rdb_url, open_storage, study_names


def test_describe_storage(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert describe_storage("optuna.journal") == f"{tmp_path}/optuna.journal"
    assert "secret" not in describe_storage("postgresql://me:secret@db.example/optuna")
    assert is_rdb_url("sqlite:///x.db") and not is_rdb_url("x.journal")


def test_journal_storage_opens_and_lists_its_studies(tmp_path):
    import optuna

    storage = open_storage(str(tmp_path / "j.journal"))
    assert study_names(storage) == []
    optuna.create_study(study_name="a", storage=storage)
    assert study_names(storage) == ["a"]


def test_bad_journal_paths_are_config_errors_naming_the_option(tmp_path):
    with pytest.raises(ConfigError, match=r"^--storage: folder .* does not exist"):
        open_storage(str(tmp_path / "missing" / "j.journal"))
    with pytest.raises(ConfigError, match=r"^--storage: .* is a folder; pass a journal file path"):
        open_storage(str(tmp_path))
