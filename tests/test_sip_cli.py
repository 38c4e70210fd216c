"""`voice-agent serve sip`: the parser, option overrides and bad-option errors (no models loaded)."""

from __future__ import annotations

import pytest

from pipelines.cli import build_parser, main
from pipelines.config import ConfigError
from pipelines.serve_sip import configure


def test_serve_sip_is_registered_next_to_the_other_transports(capsys):
    parser = build_parser()
    args = parser.parse_args(["serve", "sip", "--bind", "127.0.0.1:5999", "--max-calls", "2", "--allow", "10.0.0.0/8",
                              "--allow", "127.0.0.1/32", "--mqtt", "mqtt://127.0.0.1:1884"])  # fmt: skip
    cfg = configure(args)
    assert (cfg.sip.bind, cfg.sip.max_calls, cfg.sip.allow) == ("127.0.0.1:5999", 2, ["10.0.0.0/8", "127.0.0.1/32"])
    assert (cfg.mqtt.host, cfg.mqtt.port) == ("127.0.0.1", 1884)
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "sip", "--help"])
    assert "486 Busy Here" in capsys.readouterr().out


def test_config_file_sip_section_is_used_and_overridden(tmp_path):
    conf = tmp_path / "c.yaml"
    conf.write_text("sip:\n  max_calls: 7\n  jitter_ms: 80\n  answer_delay_ms: 500\n")
    cfg = configure(build_parser().parse_args(["serve", "sip", "--config", str(conf), "--max-calls", "3"]))
    assert (cfg.sip.max_calls, cfg.sip.jitter_ms, cfg.sip.answer_delay_ms) == (3, 80, 500)
    assert cfg.sip.jitter_min_ms == 20  # adaptive by default
    conf.write_text("sip:\n  jitter_ms: 40\n  jitter_min_ms: 60\n")
    with pytest.raises(ConfigError, match=r"sip.*jitter_min_ms \(60\) must not exceed jitter_ms \(40\)"):
        configure(build_parser().parse_args(["serve", "sip", "--config", str(conf)]))


@pytest.mark.parametrize(
    "argv",
    [["--bind", "localhost"], ["--max-calls", "0"], ["--allow", "not-a-net"], ["--public-address", "example.com"]],
)
def test_bad_options_are_one_line_errors(argv, capsys):
    with pytest.raises(ConfigError):
        configure(build_parser().parse_args(["serve", "sip", *argv]))
    assert main(["serve", "sip", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("voice-agent serve sip:") and len(err.strip().splitlines()) == 1
