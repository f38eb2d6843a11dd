"""`gpupool up` warns when its configuration file sets a password or client secret and other
accounts can read it: in embedded mode every user's workload runs as such an account."""

from __future__ import annotations

from hub_ext.cli import exposed_secrets


def test_secrets_in_a_config_others_can_read_are_named(tmp_path):
    cfg = tmp_path / "gpupool_config.py"
    cfg.write_text("c = get_config()\n# c.Gpupool.user_password = 'x'\n"
                   "c.Gpupool.admin_password = 'a' * 32\n  c.Gpupool.oidc_client_secret='s'\n")
    cfg.chmod(0o644)
    assert exposed_secrets(cfg) == ["admin_password", "oidc_client_secret"]  # not the commented one
    cfg.chmod(0o640)  # the group may read it too
    assert exposed_secrets(cfg) == ["admin_password", "oidc_client_secret"]
    cfg.chmod(0o600)
    assert exposed_secrets(cfg) == []


def test_a_config_without_secrets_is_quiet(tmp_path):
    cfg = tmp_path / "gpupool_config.py"
    cfg.write_text("c = get_config()\n# c.Gpupool.admin_password = 'gpupool-admin-password-change-me'\n")
    cfg.chmod(0o644)
    assert exposed_secrets(cfg) == []
