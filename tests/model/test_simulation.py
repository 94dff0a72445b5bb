"""The ledger's real code against its model, every step, under simulated faults
(ops/keydispenser_ops/simulation; docs/reliability.md, "The code checked against the
model").

Each seed runs keysync's ledger drain and refill, MOSIP's PUT and the ledger's lookup,
as the service has them, over a simulated PostgreSQL and Redis (fake_postgres.py, and
fakeredis running the service's own Lua), on a virtual clock, under the faults the seed
draws. Every commit, refusal, Redis command and answer is mapped to a step of the model
(mirror.py, ledger.pml's actions in Python): a step the model does not take from where
it is, an invariant it breaks, or an answer the model would not give fails the run.
The mirror is the model: its walks and the simulation's traces replay in SPIN to the
same state.

``KD_TEST_SIM_SEEDS`` raises the number of seeds (default ``SEEDS``);
``keydispenser simulate --seeds N`` runs as many as wanted.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from keydispenser_ops.simulation import spin
from keydispenser_ops.simulation.run import describe, run_one, simulate

SEEDS = 200
WALKS = 40  # random walks of the mirror replayed in SPIN

pytestmark = pytest.mark.model


def needs_spin() -> None:
    if shutil.which("spin") is None:
        if os.environ.get("KD_TEST_REQUIRE_MODEL") == "1":
            pytest.fail("the model checker needs spin on PATH")
        pytest.skip("spin not on PATH (Debian: apt-get install spin)")


def test_the_worlds_key_is_one_the_type_accepts() -> None:
    """K is a valid UIN of the world's type (MOSIP's filters, its check digit): a PUT
    of an invalid one is refused before it reaches the ledger, and the runs would check
    nothing of the PUT's protocol."""
    from keydispenser_ops.simulation import world
    from shared.domain.idtypes import build_id_types

    types = build_id_types(world.settings(), generating=False)
    assert types[world.TYPE].validate(world.KEY)


def test_every_seed_holds() -> None:
    seeds = int(os.environ.get("KD_TEST_SIM_SEEDS", SEEDS))
    summary = simulate(0, seeds, workers=1, stop_at_first=True)
    assert not summary.failed, describe(summary.failed[0])
    assert summary.seeds == seeds
    assert summary.steps > 20 * seeds  # the runs did something the model checks
    assert summary.answers > seeds  # PUTs answered, each checked against the model


def test_a_seed_runs_the_same_every_time() -> None:
    """A seed is its run: the same trace here twice, and in another process (whose
    string hashing the command pins, as here)."""
    first, again = run_one(7), run_one(7)
    assert first.trace == again.trace and first.log == again.log
    code = (
        "import json, sys; from keydispenser_ops.simulation.run import run_one; "
        "print(json.dumps(run_one(7).trace))"
    )
    env = dict(os.environ, PYTHONHASHSEED="0")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    import json

    assert [tuple(step) for step in json.loads(out.stdout)] == first.trace


def test_the_mirror_and_the_model_agree_on_walks() -> None:
    """Random walks of the mirror, replayed in SPIN: each step taken, the same
    invariant broken (or none), the same state at the end."""
    needs_spin()
    for seed in range(WALKS):
        steps, violated, mirror = spin.walk(seed)
        replayed = spin.replay(steps)
        if violated:
            assert replayed.violated, (seed, violated, replayed.output[-2000:])
            continue
        assert replayed.whole, (seed, steps, replayed.output[-2000:])
        assert replayed.digest() == mirror.digest(), (seed, steps)


def test_the_model_takes_every_step_of_a_simulated_run() -> None:
    """A run's trace, as the code made it, replayed in SPIN (runs within the replay
    world's bounds): every step is one the model takes, and it ends where the mirror
    did."""
    needs_spin()
    replayed = 0
    for seed in range(60):
        outcome = run_one(seed)
        mirror = spin.mirror_of(outcome.trace, outcome.keysyncs)
        if mirror is None or not spin.fits(mirror):
            continue
        found = spin.replay(outcome.trace)
        assert found.whole, (seed, found.output[-2000:])
        assert found.digest() == mirror.digest(), seed
        replayed += 1
        if replayed == 8:
            break
    assert replayed >= 3, "too few runs within the replay world's bounds"
