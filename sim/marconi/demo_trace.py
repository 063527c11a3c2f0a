"""A synthetic trace of the shape under which the paper's qualitative result shows: long
multi-turn conversations interleaved with one-off branches.

* ``sessions`` conversations, each opening on a private document of ``doc`` tokens; every
  turn's prompt is the whole history (document, earlier messages and answers) plus a new
  message of 50-150 tokens, and the answer (100-300 tokens) is the stream ``out/<id>``, so
  the next turn reuses the previous turn's end (Marconi's input-and-output reuse);
* after each turn, one-off requests with probability ``oneoff_p`` each (a geometric count):
  a shared ``sys_tokens`` system prompt plus a private question of ``oneoff`` tokens, never
  reused.  Each leaves a branch off the system prompt whose SSM state (tens of MB) dwarfs
  its KV (a few hundred tokens): entries that LRU keeps for their recency although they
  save little compute per byte.

Deterministic for a seed.
"""
from __future__ import annotations

import random

from sim.marconi.runs import Request, Run


def branches_trace(seed: int = 0, sessions: int = 24, turns: int = 8,
                   doc: tuple[int, int] = (2000, 6000), oneoff_p: float = 0.6,
                   oneoff: tuple[int, int] = (50, 400), sys_tokens: int = 300) -> list[Request]:
    rng = random.Random(seed)
    history: dict[int, list[Run]] = {s: [(f"doc/{s}", 0, rng.randint(*doc))] for s in range(sessions)}
    done = {s: 0 for s in range(sessions)}
    live = list(range(sessions))
    out: list[Request] = []
    k = 0
    while live:
        s = rng.choice(live)
        rid = f"c{s}-{done[s]}"
        prompt = [*history[s], (f"user/{rid}", 0, rng.randint(50, 150))]
        answer = (f"out/{rid}", 0, rng.randint(100, 300))
        out.append(Request(rid, tuple(prompt), (answer,)))
        history[s] = [*prompt, answer]
        done[s] += 1
        if done[s] == turns:
            live.remove(s)
        while rng.random() < oneoff_p:
            k += 1
            rid = f"x{k}"
            out.append(Request(rid, (("sys", 0, sys_tokens), (f"q/{rid}", 0, rng.randint(*oneoff))),
                               ((f"out/{rid}", 0, 50),)))
    return out
