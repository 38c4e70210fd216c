"""The contract between a transport and a call session, as the pipeline sees it.

It lives beside the transports, in `voice.transports.base` (the lower layer owns it: the
transports implement `AudioOutput` and stamp frames with a `Clock`); the names stay
importable from here.
"""

from __future__ import annotations

from voice.transports.base import AudioClock as AudioClock
from voice.transports.base import AudioOutput as AudioOutput
from voice.transports.base import Clock as Clock
from voice.transports.base import RealtimeClock as RealtimeClock
