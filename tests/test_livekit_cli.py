"""`voice-agent livekit dev|start`: connection settings and the worker it builds."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.config import ConfigError
from pipelines.serve_livekit import (
    CONFIG_ENV,
    PROCESS_START_TIMEOUT_S,
    build_server,
    configure,
    entrypoint,
    job_config,
    prewarm,
    register,
)

ROOT = Path(__file__).resolve().parent.parent


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="voice-agent")
    register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["livekit", *argv])


def test_settings_come_from_flags_then_config_then_environment(tmp_path: Path) -> None:
    env = {"LIVEKIT_URL": "ws://env:7880", "LIVEKIT_API_KEY": "envkey", "LIVEKIT_API_SECRET": "envsecret"}
    cfg = configure(parse("start"), env)
    assert (cfg.livekit.url, cfg.livekit.api_key, cfg.livekit.api_secret) == ("ws://env:7880", "envkey", "envsecret")
    yaml = tmp_path / "c.yaml"
    yaml.write_text("livekit:\n  url: wss://cfg.example\n  participant: alice\n")
    cfg = configure(parse("dev", "--config", str(yaml), "--api-key", "flagkey"), env)
    assert (cfg.livekit.url, cfg.livekit.api_key, cfg.livekit.participant) == ("wss://cfg.example", "flagkey", "alice")
    cfg = configure(parse("dev", "--participant", "bob", "--mqtt", "mqtt://127.0.0.1:1884"), env)
    assert cfg.livekit.participant == "bob" and (cfg.mqtt.host, cfg.mqtt.port) == ("127.0.0.1", 1884)


def test_missing_or_bad_settings_are_named() -> None:
    with pytest.raises(ConfigError, match="URL, API key, API secret"):
        configure(parse("start"), {})
    with pytest.raises(ConfigError, match="API secret"):
        configure(parse("start", "--url", "ws://x:7880", "--api-key", "k"), {})
    with pytest.raises(ConfigError, match="must start with ws://"):
        configure(parse("start", "--url", "x:7880", "--api-key", "k", "--api-secret", "s"), {})


def test_cli_exits_2_with_a_clear_message_without_settings() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIVEKIT_")}
    out = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "livekit", "start"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    assert "LIVEKIT_URL" in out.stderr and "Traceback" not in out.stderr


async def test_worker_runs_our_entrypoint_with_engines_loaded_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CONFIG_ENV, "")  # restored after the test: build_server sets it
    env = {"LIVEKIT_URL": "ws://127.0.0.1:7880", "LIVEKIT_API_KEY": "devkey", "LIVEKIT_API_SECRET": "secret"}
    cfg = configure(parse("start", "--participant", "alice"), env)
    server = build_server(cfg, agent_name="voice-agent")
    assert server.setup_fnc is prewarm
    assert server._entrypoint_fnc is entrypoint and server._agent_name == "voice-agent"
    assert server._initialize_process_timeout == PROCESS_START_TIMEOUT_S
    assert (server._ws_url, server._api_key, server._api_secret) == ("ws://127.0.0.1:7880", "devkey", "secret")
    assert job_config().livekit.participant == "alice"  # what a spawned job process reads back
