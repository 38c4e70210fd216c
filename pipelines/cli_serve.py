"""The shared ``voice-agent serve`` parent command; each live transport adds itself under it."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal

_ATTR = "_voice_agent_serve_subparsers"


def get_serve_subparsers(subparsers: argparse._SubParsersAction) -> argparse._SubParsersAction:
    """The subparsers of ``serve``: created on first call, reused by every later caller.

    Several modules (SIP, WebRTC) register ``serve <transport>``; argparse refuses a second
    ``add_parser("serve")``, so the first caller stores the child subparsers on the parent.
    """
    existing = getattr(subparsers, _ATTR, None)
    if existing is not None:
        return existing
    serve = subparsers.add_parser(
        "serve",
        help="answer live calls (serve sip, serve webrtc)",
        description="Run the agent as a server that answers live callers over one transport.",
    )
    children = serve.add_subparsers(dest="transport", metavar="TRANSPORT", required=True)
    setattr(subparsers, _ATTR, children)
    return children


def stop_on_signals() -> asyncio.Event:
    """An event set when the process gets SIGINT or SIGTERM (a service manager's stop,
    Ctrl-C). Call it first thing in a server's coroutine: a signal that comes while the models
    load or just after the server says it is listening then ends it cleanly, not by the
    signal's default action."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        # loops without signal support (Windows' proactor) raise this; there Ctrl-C still
        # arrives as KeyboardInterrupt, and the server's finally blocks close it
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    return stop
