"""The cyclic collector after the engines load (pipelines/gc_policy.py): their objects are
frozen, and a call's objects are freed by the collection run when a call ends."""

from __future__ import annotations

import gc
import weakref

import numpy as np

from pipelines.gc_policy import collect_ended_call
from tests import speech
from tests.test_replay import RATE, build_call


def test_loading_the_engines_freezes_their_objects(engines) -> None:
    # a full collection walks only what was made since, not the hundreds of thousands of
    # objects of torch, transformers and the tokenizers
    assert gc.get_freeze_count() > 100_000


def test_cyclic_garbage_with_a_big_buffer_is_freed_when_a_call_ends(engines) -> None:
    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle: reference counts alone never free it
    a.audio = np.ones(1_000_000, np.int16)
    freed = weakref.ref(a.audio)  # ndarrays take weak references
    del a, b
    assert freed() is not None
    assert collect_ended_call() >= 0.0
    assert freed() is None


async def test_a_closed_call_is_freed_by_one_collection(agent) -> None:
    from pipelines.replay import replay_pcm

    made: list[weakref.ref] = []
    new_session = agent.new_session

    def tracked(*args, **kwargs):  # the replay's session, held weakly
        session = new_session(*args, **kwargs)
        made.append(weakref.ref(session))
        return session

    agent.new_session = tracked
    pcm, _ = build_call([speech.librivox()[1]], gap_s=1.5)
    report, track = await replay_pcm(agent, pcm, RATE, fast=True)
    assert report["turns"], "the call had a turn"
    output_track = weakref.ref(track)
    del report, track
    collect_ended_call()
    assert len(made) == 1 and made[0]() is None and output_track() is None
