"""The owner's options, declared once (runtime/_cli_owner_options.py): ``tether owner`` and ``tether up`` take them
from the one table, ``tether up`` passes every one it takes to the owners it starts, and each sets its field of
``OwnerConfig``."""

from __future__ import annotations

import argparse
import os

import attrs
import pytest

from runtime._cli import build_parser
from runtime._cli_owner import supervisor_config
from runtime._cli_owner_options import OWNER_OPTIONS, OwnerOption, owner_argv, owner_config
from runtime._supervisor import Supervisor, SupervisorConfig
from storage_owner.io import OwnerConfig

# A value other than the default of every option tether up passes on (as the command line writes it).
NOT_DEFAULT = {
    "--listen": "[::1]:7001",
    "--sync": "full",
    "--clock": "manual",
    "--start-check": "2.5",
    "--group-readable": None,
    "--max-concurrent-runs": "3",
    "--heartbeat-timeout": "7.5",
    "--tls-cert": "cert.pem",
    "--tls-key": "key.pem",
    "--tls-ca": "ca.pem",
    "--insecure-listen": None,
    "--handshake-timeout": "4",
    "--max-unauthenticated": "5",
    "--max-peer-output": "6",
    "--max-queued-output": "70",
    "--model-grace": "2.5",
}


def _parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def _given(values: dict[str, str | None]) -> list[str]:
    return [arg for flag, value in values.items() for arg in ([flag] if value is None else [flag, value])]


def test_every_option_up_takes_has_a_value_here() -> None:
    assert sorted(NOT_DEFAULT) == sorted(option.flag for option in OWNER_OPTIONS if option.up)


def test_up_passes_each_owner_option_to_its_owners() -> None:
    up = _parse("up", *_given(NOT_DEFAULT))
    argv = owner_argv(up)
    owner = _parse("owner", "--db", "x.db", *argv)
    for option in OWNER_OPTIONS:
        if option.up:
            expected = getattr(up, option.dest)
            if option.flag.startswith("--tls-"):  # a path: absolute, for children started elsewhere
                expected = os.path.abspath(expected)
            assert getattr(owner, option.dest) == expected, option.flag
            assert getattr(owner, option.dest) != option.default, option.flag  # the test gives a value of its own
    assert owner.listen == ("::1", 7001)
    # By default, the owner's own defaults.
    assert _parse("owner", "--db", "x.db", *owner_argv(_parse("up"))) == _parse("owner", "--db", "x.db")


def test_the_supervisor_starts_its_owners_with_them() -> None:
    argv = owner_argv(_parse("up", "--sync", "full", "--max-concurrent-runs", "3"))
    supervisor = Supervisor(supervisor_config(_parse("up", "--sync", "full", "--max-concurrent-runs", "3")))
    assert supervisor.owner.argv[-len(argv) :] == list(argv)
    assert supervisor.standby.argv == [*supervisor.owner.argv, "--standby"]


def test_each_option_sets_its_owner_config_field() -> None:
    fields = {field.name for field in attrs.fields(OwnerConfig)}
    for option in OWNER_OPTIONS:
        for name in (option.config,) if isinstance(option.config, str) else option.config or ():
            assert name in fields, option.flag
    owner = _parse("owner", "--db", "x.db", *_given(NOT_DEFAULT), "--fault-kill-after-result", "2", "--standby")
    config = OwnerConfig(db="x.db", **owner_config(owner))
    assert (config.host, config.port, config.sync, config.clock) == ("::1", 7001, "full", "manual")
    assert (config.max_peer_output, config.max_queued_output) == (6 << 20, 70 << 20)
    assert (config.kill_after_result, config.standby, config.insecure_listen) == (2, True, True)
    assert (config.heartbeat_timeout_s, config.model_grace_ms) == (7.5, 2500)
    # Nothing given: OwnerConfig's own defaults, but for the port's (the command line's too: 0).
    assert OwnerConfig(db="x.db", **owner_config(_parse("owner", "--db", "x.db"))) == OwnerConfig(db="x.db")


@pytest.mark.parametrize("option", [o for o in OWNER_OPTIONS if o.up and o.type], ids=lambda o: o.flag)
def test_up_checks_its_owner_options_as_the_owner(option: OwnerOption, capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("up", "owner"):
        with pytest.raises(SystemExit) as exited:
            _parse(command, "--db", "x.db", option.flag, "not-a-value")
        assert exited.value.code == 2
        assert option.flag in capsys.readouterr().err


def test_up_gives_its_workers_their_drain_and_manual_grace_and_waits_for_them() -> None:
    config = supervisor_config(_parse("up", "--drain-timeout", "3", "--manual-grace", "12", "--workers", "1"))
    [worker] = Supervisor(config).workers
    assert worker.argv[-4:] == ["--drain-timeout", "3", "--manual-grace", "12"]
    worker_args = _parse(*worker.argv[worker.argv.index("worker") :])
    assert (worker_args.drain_timeout, worker_args.manual_grace) == (3.0, 12.0)
    assert config.worker_stop_timeout_s == 3 + 12 + 2  # its grace and the releases' margin, past the drain
    # By default, the grace (8 s) and the margin fit in the stop timeout (10 s): 70 s for tether stop, as it says.
    default = SupervisorConfig(db="x.db", app="m:a")
    assert default.worker_stop_timeout_s == 30 + 10
    assert default.worker_stop_timeout_s + 2 * default.stop_timeout_s + 10 == 70
