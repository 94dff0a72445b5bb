"""Named critical mutations: each breaks one guarantee's line; the tests must notice.

``make mutants`` (or ``python -m tests.mutants [NAME ...]``) copies the repository's
files into a scratch directory (the working tree is never touched), checks that the
relevant tests pass there unmutated, then applies each mutation on its own, runs only
that mutant's tests and restores the file. It exits non-zero when any mutant survives
(its tests still pass) or cannot be applied (its line moved: update the mutant).

The integration tests need the servers the suite needs (KD_TEST_POSTGRES_DSN /
KD_TEST_REDIS_URL, else embedded ones), exactly as ``make test``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parent.parent
RUN_DEADLINE_S: Final = 600.0  # per pytest run; pytest-timeout bounds each test too
# The unmutated run of every mutant's tests at once (about 60 files, acceptance tests
# among them): two workers, one file each at a time, as `make test` runs them.
BASELINE_DEADLINE_S: Final = 1_800.0
BASELINE_WORKERS: Final = ("-n", "2", "--dist", "loadfile")


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # relative to the repository root
    before: str  # must occur exactly once in ``path``
    after: str
    tests: tuple[str, ...]  # the tests that must fail with the mutation applied


CHECKDIGIT_TESTS = ("tests/unit/test_checkdigit.py", "tests/unit/test_checkdigit_tables.py")
POSTGRES_FENCE_TESTS = (
    "tests/integration/test_postgres_fence.py",
    "tests/unit/test_postgres_fence_verdict.py",
)
SNOWFLAKE_TESTS = ("tests/unit/test_snowflake.py",)
IDEMPOTENCY_TESTS = ("tests/integration/test_idempotency.py", "tests/integration/test_isolation.py")
CLIENT_TESTS = ("tests/integration/test_client.py", "clients/python/tests/test_client_protocol.py")
LEASE_TESTS = ("tests/integration/test_machine_leases.py",)
SPLIT_BRAIN_TESTS = "tests/acceptance/test_postgres_split_brain.py"
SITE_TESTS = ("tests/integration/test_sites.py",)
CLUSTER_TESTS = ("tests/integration/test_redis_cluster.py",)
# The fence's guarantee per shard with each type on a shard of its own.
SHARD_TESTS = ("tests/integration/test_cluster_types.py",)
GROUP_TESTS = ("tests/integration/test_key_groups.py",)
LEDGER_RECORD_TESTS = "tests/integration/test_ledger_record.py"
LEDGER_HISTORY_TESTS = "tests/integration/test_ledger_history.py"
# The ledger's real code under simulated faults, checked against the model.
SIMULATION_TESTS = "tests/model/test_simulation.py::test_every_seed_holds"
QUARANTINE_TEST = (
    f"{LEDGER_HISTORY_TESTS}::test_accepting_a_loss_quarantines_what_it_cannot_vouch_for"
)
PGBOUNCER_TESTS = "tests/acceptance/test_pgbouncer.py"
REDIS_ACL_TESTS = "tests/acceptance/test_redis_acl.py"
CHART_TESTS = ("tests/integration/test_helm_chart.py",)
ROLE_TESTS = ("tests/integration/test_roles.py",)
IMPORT_TESTS = "tests/integration/test_imports.py"
HELPERS = "deploy/helm/keydispenser/templates/_helpers.tpl"

MUTANTS: Final = (
    Mutant(
        "a_quarantined_key_released",
        "shared/stores/ledger/sql.py",
        "SELECT 1 FROM kd_quarantined_keys AS q WHERE q.id_type = $5 AND q.key = u.key",
        "SELECT 1 WHERE false",
        (
            f"{LEDGER_HISTORY_TESTS}::"
            "test_a_quarantined_key_of_a_type_never_reissuing_is_not_released",
        ),
    ),
    Mutant(
        "a_put_answered_before_its_change_is_replicated",
        "dispenser/mosip.py",
        "    await _durable(dispenser, id_type)\n",
        "",
        (
            "tests/integration/test_ledger_durability.py::"
            "test_a_put_is_answered_only_once_its_change_is_replicated",
        ),
    ),
    Mutant(
        "a_ledger_link_committed_before_it_is_replicated",
        "keysync/ledger.py",
        "            await self._link_durable()\n",
        "",
        (
            "tests/integration/test_ledger_durability.py::"
            "test_a_ledger_link_commits_only_once_it_is_replicated",
        ),
    ),
    Mutant(
        # Both tiers lost state and the fence halted: a lookup said "being restored"
        # (IDG-005, retry at once) rather than the halt and the operator's command.
        "a_fence_halt_answered_as_being_restored",
        "shared/stores/ledger/reader.py",
        "            if record.halted:  # both tiers lost state: an operator fences first\n",
        "            if False:\n",
        (f"{LEDGER_HISTORY_TESTS}::test_a_fence_halt_is_said_at_once_to_puts_and_lookups",),
    ),
    Mutant(
        "a_quarantined_key_given_back",
        "shared/stores/ledger/sql.py",
        "SELECT 1 FROM kd_quarantined_keys AS q WHERE q.id_type = $1 AND q.key = u.key",
        "SELECT 1 WHERE false",
        (QUARANTINE_TEST,),
    ),
    Mutant(
        "a_quarantined_key_requeued",
        "shared/stores/ledger/sql.py",
        "            OR EXISTS (\n",
        "            OR false AND EXISTS (\n",
        (QUARANTINE_TEST,),
    ),
    Mutant(
        "nothing_quarantined_when_a_loss_is_accepted",
        "shared/cli/status.py",
        "quarantined = {n: await _quarantine(conn, n, reason) for n in ledgers}",
        "quarantined = {n: list[str]() for n in ledgers}",
        (QUARANTINE_TEST,),
    ),
    Mutant(
        "a_confirmation_wakes_no_waiting_put",
        "shared/stores/ledger/lua/ledger_confirm.lua",
        "redis.call('XADD', confirmed, 'MAXLEN', confirmed_kept, '*', 'acked', acked)\n",
        "",
        (
            f"{LEDGER_HISTORY_TESTS}::"
            "test_a_client_waiting_for_an_outcome_is_woken_by_its_confirmation",
        ),
    ),
    Mutant(
        "a_ledger_log_shorter_than_the_fence_s_detection_accepted",
        "shared/domain/config/settings.py",
        "        floor = self.promotion_detected_s\n",
        "        floor = 1.0\n",
        ("tests/unit/test_settings.py",),
    ),
    Mutant(
        "a_halted_ledger_left_to_the_put_s_wait",
        "dispenser/mosip.py",
        "    reason = await dispenser.ledger.halted(name)\n",
        '    reason = ""\n',
        (f"{LEDGER_HISTORY_TESTS}::test_a_halted_ledger_says_so_at_once_to_puts_and_lookups",),
    ),
    Mutant(
        "types_share_one_slot_on_a_cluster",
        "shared/domain/config/redis.py",
        '            return "{" + f"{self.redis_namespace}.{name}" + "}"',
        "            return self.redis_key_namespace",
        ("tests/integration/test_cluster_types.py",),
    ),
    Mutant(
        "a_new_timeline_taken_up_by_one_groups_write",
        "shared/stores/fence/sql.py",
        "        WHEN ($4::int & 2) = 2 AND c.timeline <> here.tl THEN false\n",
        "",
        (SPLIT_BRAIN_TESTS,),
    ),
    Mutant(
        "a_pending_claim_taken_for_a_committed_fence",
        "shared/stores/fence/postgres_fence.py",
        '        return "confirm" if on_claim and row.fences >= record.claim_fences else "behind"',
        '        return "confirm"',
        (SPLIT_BRAIN_TESTS,),
    ),
    Mutant(
        "a_fence_judges_only_the_records_of_types_it_is_configured_with",
        "shared/stores/groups.py",
        "            if self._opener is None or name in self._of_type:\n                continue",
        "            continue",
        GROUP_TESTS,
    ),
    Mutant(
        "one_shard_down_holds_every_types_start",
        "shared/stores/fence/binding.py",
        "            if records is None or not records.several:",
        "            if True:",
        GROUP_TESTS,
    ),
    Mutant(
        "a_fence_claims_only_the_first_group",
        "shared/stores/fence/postgres_fence.py",
        "    for sync, record in read.items():\n        target = restore_to.get(",
        "    for sync, record in list(read.items())[:1]:\n        target = restore_to.get(",
        GROUP_TESTS,
    ),
    Mutant(
        "a_fence_runs_while_another_group_must_be_vouched_for",
        "shared/stores/fence/verdict.py",
        '        if fence != "operator" and any(record.needs_vouch for record in records):',
        "        if False:",
        GROUP_TESTS,
    ),
    Mutant(
        "a_type_judged_against_another_groups_record",
        "shared/stores/groups.py",
        "        return self.records[self._of_type[name]]",
        "        return next(iter(self.records.values()))",
        GROUP_TESTS,
    ),
    Mutant(
        "readiness_waits_for_a_frozen_shard",
        "dispenser/service.py",
        "asyncio.wait_for(self._type_state(n), TYPE_STATE_S)",
        "asyncio.wait_for(self._type_state(n), None)",
        SHARD_TESTS,
    ),
    Mutant(
        "a_routed_operation_reaches_the_first_group",
        "shared/stores/groups.py",
        "        return self.ports[self._groups.settings.key_namespace_of(name)]",
        "        return next(iter(self.ports.values()))",
        (*SHARD_TESTS, "tests/unit/test_routers.py"),
    ),
    Mutant(
        "a_shard_fence_accepts_any_owner_token_with_types_spread",
        "shared/stores/fence/lua/fence.lua",
        "if redis.call('GET', FENCE) == token then",
        "if redis.call('GET', FENCE) then",
        SHARD_TESTS,
    ),
    Mutant(
        "a_shard_keeps_inherited_lists_with_types_spread",
        "shared/stores/fence/lua/fence.lua",
        "      redis.call('UNLINK', list)",
        "      -- kept",
        SHARD_TESTS,
    ),
    Mutant(
        "a_cluster_shard_fence_accepts_any_owner_token",
        "shared/stores/fence/lua/fence.lua",
        "if redis.call('GET', FENCE) == token then",
        "if redis.call('GET', FENCE) then",
        CLUSTER_TESTS,
    ),
    Mutant(
        "a_cluster_shard_keeps_inherited_lists",
        "shared/stores/fence/lua/fence.lua",
        "      redis.call('UNLINK', list)",
        "      -- kept",
        CLUSTER_TESTS,
    ),
    Mutant(
        "cluster_keys_without_a_hash_tag",
        "shared/domain/config/redis.py",
        '            return "{" + self.redis_namespace + "}"',
        "            return self.redis_namespace",
        CLUSTER_TESTS,
    ),
    Mutant(
        "cluster_endpoint_ignores_moved",
        "shared/stores/redis/endpoint.py",
        "    cluster_moves = (AskError, TryAgainError, ClusterDownError)",
        "    cluster_moves = ()",
        ("tests/unit/test_redis_endpoint.py",),
    ),
    Mutant(
        "a_site_leases_past_the_end_of_its_share",
        "shared/stores/postgres/sql.py",
        "    SELECT $5, v, LEAST(v + $6, (SELECT seqmax + 1 FROM pg_sequence\n"
        "                                 WHERE seqrelid = '{seq}'::regclass)), $7",
        "    SELECT $5, v, v + $6, $7",
        SITE_TESTS,
    ),
    Mutant(
        "a_site_sequence_starts_at_counter_zero",
        "shared/stores/postgres/sql.py",
        '"MINVALUE {minvalue} MAXVALUE {maxvalue} START WITH {minvalue} NO CYCLE"',
        '"MINVALUE 0 MAXVALUE {maxvalue} START WITH 0 NO CYCLE"',
        SITE_TESTS,
    ),
    Mutant(
        "a_dropped_site_goes_unnoticed",
        "shared/stores/postgres/schema.py",
        "for field in [*current, *(f for f in stored if f not in current)]:",
        "for field in current:",
        SITE_TESTS,
    ),
    Mutant(
        "a_fence_moves_a_site_sequence_below_its_share",
        "shared/stores/fence/postgres_fence.py",
        "next_start = int(last) + size if last is not None else bottom",
        "next_start = int(last) + size if last is not None else 0",
        SITE_TESTS,
    ),
    Mutant(
        "headroom_counts_the_whole_domain_for_a_site",
        "shared/stores/postgres/cold_store.py",
        "leased = 0 if end is None else min(end, config.counter_stop) - config.counter_start",
        "leased = 0 if end is None else min(end, config.counter_stop)",
        SITE_TESTS,
    ),
    Mutant(
        "token_audience_not_checked",
        "dispenser/oidc.py",
        'options={"require": ["exp", "iss", "aud"]},',
        'options={"require": ["exp", "iss"], "verify_aud": False},',
        ("tests/integration/test_oidc.py",),
    ),
    Mutant(
        "token_expiry_not_checked",
        "dispenser/oidc.py",
        'options={"require": ["exp", "iss", "aud"]},',
        'options={"require": ["exp", "iss", "aud"], "verify_exp": False},',
        ("tests/integration/test_oidc.py",),
    ),
    Mutant(
        "remembered_token_outlives_its_expiry",
        "dispenser/oidc.py",
        "if known.expires > now - self.config.leeway_s:",
        "if True:",
        ("tests/unit/test_oidc.py",),
    ),
    Mutant(
        "released_key_reissued_without_the_opt_in",
        "shared/stores/ledger/decide.py",
        "_release(conn, name, marks, name in batch.reissue, done)",
        "_release(conn, name, marks, True, done)",
        ("tests/integration/test_mosip.py",),
    ),
    Mutant(
        "a_redelivered_release_gives_back_the_next_issue",
        "shared/stores/ledger/sql.py",
        "      AND NOT EXISTS (\n"
        "          SELECT 1 FROM kd_released_issues AS r\n"
        "          WHERE r.id_type = $1 AND r.key = u.key AND r.release_entry = u.entry\n"
        "      )\n",
        "",
        (LEDGER_RECORD_TESTS,),
    ),
    Mutant(
        "released_key_requeued_at_once",
        "shared/stores/ledger/sql.py",
        "      AND r.recorded_at <= now() - make_interval(secs => $2::double precision)",
        "      AND true",
        ("tests/integration/test_mosip.py", LEDGER_RECORD_TESTS),
    ),
    Mutant(
        "a_release_aged_on_the_redis_servers_clock",
        "shared/stores/ledger/sql.py",
        "      AND r.recorded_at <= now() - make_interval(secs => $2::double precision)",
        "      AND r.released_at <= now() - make_interval(secs => $2::double precision)",
        (LEDGER_RECORD_TESTS,),
    ),
    Mutant(
        "a_retry_gets_back_a_uin_given_back",
        "dispenser/mosip.py",
        "        forget = [(found.client, held)] if held and found.client else []",
        "        forget = []",
        ("tests/integration/test_mosip.py",),
    ),
    Mutant(
        "a_ledger_link_not_logged_before_its_commit",
        "keysync/ledger.py",
        "            await self._stream.add_link(link, prev, applied.ops)\n",
        "",
        (LEDGER_RECORD_TESTS, SIMULATION_TESTS),
    ),
    Mutant(
        "a_restore_writes_nothing",
        "keysync/ledger.py",
        "            await apply_ops(conn, ops)\n",
        "",
        (LEDGER_RECORD_TESTS, SIMULATION_TESTS),
    ),
    Mutant(
        # A second promotion's fence restores only up to the record's head (the first
        # fenced server's own), not the restore the first fence found needed.
        "a_second_promotion_forgets_the_pending_restore",
        "shared/stores/fence/postgres_fence.py",
        "    target = record.restore_to or record.head\n",
        "    target = record.head\n",
        (LEDGER_HISTORY_TESTS, SIMULATION_TESTS),
    ),
    Mutant(
        # A fence keeps the restore its server had pending from an earlier fence, though
        # the record moved past it (a promotion back to that fence's server).
        "a_fence_keeps_an_older_pending_restore",
        "shared/stores/fence/postgres_fence.py",
        "    target = record.restore_to or record.head\n",
        "    target = row.restore_to.get(lane) or record.restore_to or record.head\n",
        (LEDGER_HISTORY_TESTS,),
    ),
    Mutant(
        # A restore refused on a server promoted again without loss only fences (which
        # finds nothing to do): it never takes the new timeline up, and never passes.
        "a_refused_restore_never_takes_the_timeline_up",
        "keysync/ledger.py",
        "                state = await self._state()\n"
        "                await self._settle(state, record)\n",
        "                await self._guard.fence()\n",
        ("tests/acceptance/test_ledger_two_promotions.py", SIMULATION_TESTS),
    ),
    Mutant(
        # A restore that never asks whether its server already holds the target: of two
        # keysyncs restoring at once, the second writes links' operations again (over
        # what was decided since the first).
        "a_restore_writes_links_its_server_already_holds",
        "keysync/ledger.py",
        "        if await conn.fetchval(ledger_sql.HOLDS_LINK, target):\n            return []\n",
        "",
        (LEDGER_HISTORY_TESTS,),
    ),
    Mutant(
        # A restore run from a refused batch writes while another keysync's restore has
        # halted the ledger.
        "a_restore_ignores_the_ledgers_halt",
        "keysync/ledger.py",
        "            if record.ledger_halt:  # another keysync's restore found a link gone\n",
        "            if False:\n",
        (LEDGER_HISTORY_TESTS,),
    ),
    Mutant(
        # A vouch decided before Redis lost state again (its process stalled between
        # its commit and the record) rebuilds the record from a stamp behind what was
        # recorded in between.
        "a_stalled_vouch_rebuilds_the_record",
        "shared/stores/fence/lua/vouch_record.lua",
        "if epoch ~= '-' and (redis.call('HGET', SYNC_RECORD, 'fenced_at') or '') ~= epoch then",
        "if false then",
        ("tests/integration/test_push_stamp.py",),
    ),
    Mutant(
        # A restore that replays the lost links newest first (the log walked back, not
        # turned around): a later link's writes undone by an earlier one's.
        "a_restore_replays_links_newest_first",
        "keysync/ledger.py",
        "            if await conn.fetchval(ledger_sql.HOLDS_LINK, want):\n"
        "                return list(reversed(found))\n",
        "            if await conn.fetchval(ledger_sql.HOLDS_LINK, want):\n"
        "                return found\n",
        (LEDGER_HISTORY_TESTS, SIMULATION_TESTS),
    ),
    Mutant(
        # A confirmation that publishes its outcomes (and acknowledges its entries) even
        # when the record refuses its stamp (a transaction on a history the record no
        # longer follows).
        "an_outcome_published_though_its_stamp_is_refused",
        "shared/stores/ledger/lua/ledger_confirm.lua",
        "if status ~= 'ok' then\n  return {status, 0}\nend\n",
        "",
        (SIMULATION_TESTS,),
    ),
    Mutant(
        # An entry applied again (its keysync stalled after its commit, the batch
        # claimed once the key was requeued and issued anew) decided again, not given
        # the outcome decided first: a release answered "not found".
        "an_outcome_decided_again",
        "shared/stores/ledger/decide.py",
        "        if rows:\n            found[name] =",
        "        if False:\n            found[name] =",
        (LEDGER_HISTORY_TESTS, SIMULATION_TESTS),
    ),
    Mutant(
        "the_dispenser_reads_keys_still_to_be_handed_out",
        "shared/stores/postgres/grants.py",
        'LEDGER: Final = {"keysync": "SELECT, INSERT, UPDATE, DELETE", "dispenser": _READ,',
        'COLD["dispenser"] = _READ\n'
        'LEDGER: Final = {"keysync": "SELECT, INSERT, UPDATE, DELETE", "dispenser": _READ,',
        ROLE_TESTS,
    ),
    Mutant(
        "keygen_may_rewrite_the_ledger",
        "shared/stores/postgres/grants.py",
        '"keysync": "SELECT, INSERT, UPDATE, DELETE", "dispenser": _READ, "status": _READ}',
        '"keysync": "SELECT, INSERT, UPDATE, DELETE", "keygen": "UPDATE, DELETE", '
        '"dispenser": _READ, "status": _READ}',
        ROLE_TESTS,
    ),
    Mutant(
        "migrate_leaves_earlier_grants_in_place",
        "shared/stores/postgres/grants.py",
        '            await conn.execute(f"REVOKE ALL ON {target} FROM {sql.ident(role)}")\n',
        "",
        ROLE_TESTS,
    ),
    Mutant(
        "each_worker_answers_metrics_for_itself",
        "dispenser/main.py",
        "    with worker_metrics_directory(config.workers):",
        "    with worker_metrics_directory(1):",
        ("tests/acceptance/test_worker_metrics.py",),
    ),
    Mutant(
        "a_refused_lookup_is_a_server_fault",
        "shared/stores/ledger/reader.py",
        '            raise StoreUnavailable("postgres", f"cannot use PostgreSQL: {exc}") from exc',
        "            raise",
        ("tests/acceptance/test_fail_fast.py",),
    ),
    Mutant(
        "the_headroom_metric_follows_its_own_leases_only",
        "keygen/main.py",
        "            elif time.monotonic() - self._headroom_seen.get(",
        "            elif False and time.monotonic() - self._headroom_seen.get(",
        ("tests/integration/test_headroom_agrees.py",),
    ),
    Mutant(
        # The log trimmed by every confirmation, the refused ones too (an old primary's
        # keysync still confirming after the fence): trimmed while the restore waits.
        "the_log_trimmed_while_a_restore_waits",
        "shared/stores/ledger/lua/ledger_confirm.lua",
        "if status ~= 'ok' then\n  return {status, 0}\nend\n",
        "local now0 = redis.call('TIME')\n"
        "redis.call('XTRIM', log, 'MINID', '~', "
        "string.format('%d', math.max(tonumber(now0[1]) * 1000 - retain_ms, 0)))\n"
        "if status ~= 'ok' then\n  return {status, 0}\nend\n",
        (LEDGER_HISTORY_TESTS, SIMULATION_TESTS),
    ),
    Mutant(
        # The restore pending kept when a later link is confirmed (cleared by nobody):
        # the ledger stays restoring (and a later fence restores only up to it).
        "a_restore_pending_kept_past_the_links_that_follow_it",
        "shared/stores/ledger/lua/ledger_confirm.lua",
        "redis.call('HDEL', SYNC_RECORD, 'restore_from')\n",
        "",
        (LEDGER_HISTORY_TESTS, SIMULATION_TESTS),
    ),
    Mutant(
        # A restore that walks to the target it began with though nobody asks for it any
        # more (restored by another keysync, or replaced by a later fence's, restored
        # since): it halts the ledger for nothing.
        "a_restore_walks_to_a_target_no_longer_asked_for",
        "keysync/ledger.py",
        "if await self._asked(conn, target) else []",
        "if True else []",
        (LEDGER_HISTORY_TESTS,),
    ),
    Mutant(
        # A replayed issue's skip naming the key, not the issue: a restore of a link
        # that held a released issue applied again beside the key's next issue skips
        # the next one too.
        "a_restore_skips_every_issue_of_a_key_one_entry_replayed",
        "shared/stores/ledger/sql.py",
        "SELECT b.entry_id || ' ' || b.key AS issue FROM batch AS b",
        "SELECT b.key AS issue FROM batch AS b",
        (LEDGER_RECORD_TESTS,),
    ),
    Mutant(
        "a_restore_waits_for_the_next_entry",
        "keysync/ledger.py",
        "        if self._guard is None or self._sync is None:\n            return\n"
        "        record = await self._sync.read()",
        "        if True:\n            return\n        record = await self._sync.read()",
        (LEDGER_HISTORY_TESTS,),
    ),
    Mutant(
        "a_lookup_reads_a_server_behind_the_record",
        "shared/stores/ledger/reader.py",
        '        if verdict(state, record) != "ok" and not _never_guarded(state, record):',
        "        if False:",
        (LEDGER_HISTORY_TESTS,),
    ),
    Mutant(
        "a_lookup_answers_before_the_record_covers_it",
        "shared/stores/ledger/reader.py",
        "        while record.clock < state.clock:",
        "        while False:",
        (LEDGER_HISTORY_TESTS, SIMULATION_TESTS),
    ),
    Mutant(
        "an_empty_take_steps_the_clock_unrecorded",
        "keysync/main.py",
        "                    await taken.rollback()",
        "                    await taken.commit()",
        (LEDGER_HISTORY_TESTS,),
    ),
    Mutant(
        "ledger_batches_not_guarded",
        "keysync/ledger.py",
        "        self._guard = guard if guard is not None and guard.guarded else None",
        "        self._guard = None",
        (LEDGER_RECORD_TESTS, SIMULATION_TESTS),
    ),
    Mutant(
        "a_replicated_ledger_type_answers_before_its_record_is_copied",
        "dispenser/sources.py",
        '        if config.ledger_durability == "async" or not popped.keys:',
        "        if True:",
        ("tests/integration/test_ledger_durability.py",),
    ),
    Mutant(
        "a_ledger_retry_replayed_from_an_inherited_record",
        "shared/stores/hot/lua/pop_idempotent.lua",
        "local owned_only = ARGV[7] == '1'",
        "local owned_only = false",
        ("tests/integration/test_ledger_durability.py",),
    ),
    Mutant(
        "a_mark_batch_shares_the_ledger_lock",
        "shared/stores/ledger/decide.py",
        "    alone = bool(batch.used or batch.released)",
        "    alone = False",
        (LEDGER_RECORD_TESTS,),
    ),
    Mutant(
        "a_reissuing_types_retry_outlives_its_release",
        "shared/domain/config/id_types.py",
        "        if self.ledger and self.reissue_released:",
        "        if False:",
        ("tests/unit/test_ledger_parse.py",),
    ),
    Mutant(
        "a_replayed_issue_revives_a_released_issue",
        "shared/stores/ledger/sql.py",
        "    SELECT b.key, b.issued_at, b.client, b.idempotency_key, b.entry_id FROM batch AS b\n"
        "    WHERE NOT EXISTS (",
        "    SELECT b.key, b.issued_at, b.client, b.idempotency_key, b.entry_id FROM batch AS b\n"
        "    WHERE true OR NOT EXISTS (",
        (LEDGER_RECORD_TESTS,),
    ),
    Mutant(
        "a_replayed_issue_of_a_released_key_raises_the_duplicate_alarm",
        "shared/stores/ledger/sql.py",
        "WHERE l.entry_id <> b.entry_id\n  AND NOT EXISTS (",
        "WHERE l.entry_id <> b.entry_id\n  AND true OR false AND NOT EXISTS (",
        (LEDGER_RECORD_TESTS,),
    ),
    Mutant(
        "a_released_key_requeued_while_its_issue_is_live",
        "shared/stores/ledger/sql.py",
        "INSERT INTO {cold} (key) SELECT key FROM due WHERE NOT requeue_discarded",
        "INSERT INTO {cold} (key) SELECT key FROM due",
        (LEDGER_RECORD_TESTS,),
    ),
    Mutant(
        "a_fence_leaves_releases_to_be_requeued",
        "shared/stores/fence/postgres_fence.py",
        "    rows = await conn.fetch(ledger_sql.SETTLE_RELEASES)",
        "    rows = []",
        (LEDGER_RECORD_TESTS,),
    ),
    Mutant(
        "a_jwks_key_without_alg_verifies_any_algorithm",
        "dispenser/oidc.py",
        'return algorithm.startswith(KEY_FAMILIES.get(self.kty, ("-",)))',
        "return True",
        ("tests/integration/test_oidc.py",),
    ),
    Mutant(
        "a_redelivered_mark_uses_the_next_issue",
        "shared/stores/ledger/sql.py",
        "  AND u.used_at >= l.issued_at AND (u.admin OR l.client = u.client)",
        "  AND (u.admin OR l.client = u.client)",
        ("tests/integration/test_mosip.py",),
    ),
    Mutant(
        "released_key_still_marked_used",
        "shared/stores/ledger/sql.py",
        "WHERE l.key = u.key AND l.used_at IS NULL AND l.released_at IS NULL\n"
        "  AND u.used_at >= l.issued_at AND",
        "WHERE l.key = u.key AND l.used_at IS NULL\n  AND u.used_at >= l.issued_at AND",
        ("tests/integration/test_mosip.py",),
    ),
    Mutant(
        "fence_runs_on_a_replica",
        "shared/stores/fence/lua/fence.lua",
        "if string.match(replication, 'role:(%a+)') ~= 'master' then",
        "if false then",
        ("tests/integration/test_replica_fence.py",),
    ),
    Mutant(
        "fence_accepts_any_owner_token",
        "shared/stores/fence/lua/fence.lua",
        "if redis.call('GET', FENCE) == token then",
        "if redis.call('GET', FENCE) then",
        ("tests/integration/test_fence.py", "tests/integration/test_replica_fence.py"),
    ),
    Mutant(
        "fence_keeps_inherited_lists",
        "shared/stores/fence/lua/fence.lua",
        "      redis.call('UNLINK', list)",
        "      -- kept",
        ("tests/acceptance/test_prefetch.py",),
    ),
    Mutant(
        "stock_refilled_from_a_nearly_empty_list",
        "dispenser/sources.py",
        "plenty = self._seen >= PLENTY * ahead and not self._closed",
        "plenty = True",
        ("tests/unit/test_pool.py", "tests/acceptance/test_servers.py"),
    ),
    Mutant(
        "keys_a_pop_brings_after_the_stop_are_stocked_uncounted",
        "dispenser/sources.py",
        "if self._stock is not None and not self._closed and issued >= self._stale_before:",
        "if self._stock is not None and issued >= self._stale_before:",
        ("tests/unit/test_pool.py",),
    ),
    Mutant(
        "stock_dropped_uncounted",
        "dispenser/sources.py",
        "            self.lost(len(stock))\n            self._dropped",
        "            self._dropped",
        ("tests/unit/test_pool.py",),
    ),
    Mutant(
        "keysync_pushes_before_its_commit_point",
        "keysync/main.py",
        '                self._fault("keysync.committed")'
        "  # the DELETE committed, nothing pushed yet\n"
        "                size = _want(config, depth + len(taken.keys))\n"
        "                depth, following = await self._push_taking_next(name, taken, size)\n",
        "                size = _want(config, depth + len(taken.keys))\n"
        "                depth, following = await self._push_taking_next(name, taken, size)\n"
        '                self._fault("keysync.committed")\n',
        ("tests/integration/test_fault_points.py",),
    ),
    Mutant(
        "keysync_commits_the_next_batch_before_the_push_succeeded",
        "keysync/main.py",
        "            await following.rollback()\n            return await pushing, None",
        "            await following.commit()\n            return await pushing, None",
        ("tests/integration/test_fault_points.py", "tests/unit/test_keysync_push.py"),
    ),
    Mutant(
        "an_open_take_may_hold_the_clock_lock_forever",
        "shared/stores/postgres/cold_store.py",
        "await conn.execute(sql.LIMIT_IDLE_TAKE, str(idle_limit_ms))",
        "await conn.execute(sql.LIMIT_IDLE_TAKE, '0')",
        ("tests/integration/test_postgres_fence.py",),
    ),
    Mutant(
        "a_take_may_wait_on_a_gone_client_as_long_as_tcp_does",
        "shared/stores/postgres/sql.py",
        "\" set_config('tcp_user_timeout', $1, true)\"\n)",
        "\" set_config('application_name', $1, true)\"\n)",
        ("tests/integration/test_postgres_fence.py",),
    ),
    Mutant(
        "a_failed_connection_release_fails_a_committed_take",
        "shared/stores/postgres/cold_store.py",
        '    except Exception as exc:\n        log.warning("connection_release_failed"',
        '    except ZeroDivisionError as exc:\n        log.warning("connection_release_failed"',
        ("tests/unit/test_open_take.py",),
    ),
    Mutant(
        "the_drill_reads_no_lease_renewals",
        "ops/keydispenser_ops/drill/runner.py",
        '    log_levels = {"shared.leases.holder": "DEBUG"}',
        '    log_levels = {"shared.leases.holder": "INFO"}',
        ("tests/acceptance/test_drill.py",),
    ),
    Mutant(
        "request_latency_counts_a_bound_in_the_next_bucket",
        "dispenser/metrics.py",
        "counts[bisect_left(bounds, seconds)] += 1",
        'counts[__import__("bisect").bisect_right(bounds, seconds)] += 1',
        ("tests/unit/test_route_latency.py",),
    ),
    Mutant(
        "an_api_key_scoped_by_alias_reaches_nothing",
        "dispenser/auth.py",
        "frozenset(names.get(t, t) for t in c.id_types)",
        "frozenset(c.id_types)",
        ("tests/unit/test_auth.py",),
    ),
    Mutant(
        "keysync_take_batch_never_deletes",
        "shared/stores/postgres/sql.py",
        "    DELETE FROM {cold}\n"
        "    WHERE ctid = ANY (ARRAY(SELECT ctid FROM {cold} LIMIT $1))\n"
        "    RETURNING key",
        "    SELECT key FROM {cold}\n"
        "    WHERE ctid = ANY (ARRAY(SELECT ctid FROM {cold} LIMIT $1))",
        ("tests/integration/test_pipeline.py", "tests/integration/test_fault_points.py"),
    ),
    Mutant(
        "keygen_copies_outside_its_transaction",
        "shared/stores/postgres/cold_store.py",
        'async with translated("insert_keys"), conn.transaction():',
        'async with translated("insert_keys"):',
        ("tests/integration/test_fault_points.py",),
    ),
    Mutant(
        "sentinel_endpoint_never_re_resolves_after_an_error",
        "shared/stores/redis/endpoint.py",
        "        if self._discovered is not None:\n            self._stale = True",
        "        if False:\n            self._stale = True",
        ("tests/integration/test_sentinel_endpoint.py",),
    ),
    Mutant(
        "sentinel_endpoint_never_re_checks_the_primary",
        "shared/stores/redis/endpoint.py",
        "        if self._discovered is not None and self._verify_due():",
        "        if False:",
        ("tests/integration/test_sentinel_endpoint.py",),
    ),
    Mutant(
        "embedded_redis_shares_the_terminals_process_group",
        "ops/keydispenser_ops/embedded.py",
        'spawn(command, output="discard", own_session=True)',
        'spawn(command, output="discard")',
        ("tests/integration/test_bounds.py",),
    ),
    Mutant(
        "a_type_may_be_named_like_the_fences_registry",
        "shared/domain/config/id_types.py",
        "        if name in redis_keys.RESERVED_TYPE_NAMES:",
        "        if False:",
        ("tests/unit/test_settings.py",),
    ),
    Mutant(
        "verhoeff_position_off_by_one",
        "shared/domain/checkdigit.py",
        "c = _D[c][_P[(i + 1) % 8][int(ch)]]",
        "c = _D[c][_P[i % 8][int(ch)]]",
        CHECKDIGIT_TESTS,
    ),
    Mutant(
        "verhoeff_table_row7_entries_0_and_5_swapped",
        "shared/domain/checkdigit.py",
        "(7, 0, 4, 6, 9, 1, 3, 2, 5, 8),",
        "(1, 0, 4, 6, 9, 7, 3, 2, 5, 8),",
        CHECKDIGIT_TESTS,
    ),
    Mutant(
        "verhoeff_inverse_entry_swapped",
        "shared/domain/checkdigit.py",
        "_INV = (0, 4, 3, 2, 1, 5, 6, 7, 8, 9)",
        "_INV = (0, 3, 4, 2, 1, 5, 6, 7, 8, 9)",
        CHECKDIGIT_TESTS,
    ),
    Mutant(
        "a_numeric_key_validates_without_its_check_digit",
        "shared/domain/formats/numeric.py",
        "        if self._verhoeff and not verhoeff_valid(core):",
        "        if False:",
        ("tests/unit/test_idtypes.py",),
    ),
    Mutant(
        "a_fingerprint_records_another_alphabet",
        "shared/domain/idtypes.py",
        "            alphabet=self.format.alphabet,",
        "            alphabet=self.format.alphabet[:10],",
        ("tests/unit/test_formats.py",),
    ),
    Mutant(
        "postgres_guard_passes_a_server_behind_on_the_same_timeline",
        "shared/stores/fence/sql.py",
        "WHEN here.tl = $1::bigint THEN c.clock >= $2::bigint",
        "WHEN here.tl = $1::bigint THEN true",
        POSTGRES_FENCE_TESTS,
    ),
    Mutant(
        "postgres_guard_given_a_permissive_record",
        "shared/stores/fence/sync_record.py",
        "return [self.timeline, self.clock, self.fork, flags]",
        "return [-1, 0, 0, 0]",
        POSTGRES_FENCE_TESTS,
    ),
    Mutant(
        "push_ignores_a_stale_stamp",
        "shared/stores/hot/lua/push.lua",
        "  if status ~= 'ok' then",
        "  if false then",
        (*POSTGRES_FENCE_TESTS, "tests/integration/test_push_stamp.py"),
    ),
    Mutant(
        "fence_claims_the_record_over_a_lease_recorded_meanwhile",
        "shared/stores/fence/lua/reset_record.lua",
        "and tonumber(fields[i + 1]) > (floors[fields[i]] or 0) then",
        "and false then",
        ("tests/integration/test_push_stamp.py", SPLIT_BRAIN_TESTS),
    ),
    Mutant(
        "fence_claims_the_record_for_an_older_timeline",
        "shared/stores/fence/lua/reset_record.lua",
        "if (tonumber(rec[2]) or 0) > timeline then",
        "if false then",
        ("tests/integration/test_push_stamp.py",),
    ),
    Mutant(
        "record_moves_back_to_an_older_timeline",
        "shared/stores/fence/lua/sync_record.lua",
        "  if timeline > tl then",
        "  if timeline ~= tl then",
        ("tests/integration/test_push_stamp.py", SPLIT_BRAIN_TESTS),
    ),
    Mutant(
        "record_judges_by_a_record_redis_lost",
        "shared/stores/fence/lua/sync_record.lua",
        "  if rec[4] == '1' or tl == 0 then",
        "  if false then",
        ("tests/integration/test_push_stamp.py",),
    ),
    Mutant(
        "record_takes_another_history_on_its_timeline",
        "shared/stores/fence/lua/sync_record.lua",
        "    if fork ~= rfork then",
        "    if false then",
        ("tests/integration/test_push_stamp.py",),
    ),
    Mutant(
        "record_takes_another_databases_stamp",
        "shared/stores/fence/lua/sync_record.lua",
        "  if rec[6] and rec[6] ~= database then",
        "  if false then",
        ("tests/integration/test_push_stamp.py",),
    ),
    Mutant(
        "vouch_takes_an_older_timeline",
        "shared/stores/fence/lua/vouch_record.lua",
        "if tl > timeline then",
        "if false then",
        ("tests/integration/test_push_stamp.py",),
    ),
    Mutant(
        "vouch_trusts_what_redis_kept_of_the_leases",
        "shared/stores/fence/lua/vouch_record.lua",
        "raise_leased(FIRST_HIGH)",
        "-- raise_leased(FIRST_HIGH)",
        ("tests/integration/test_both_tiers.py",),
    ),
    Mutant(
        "an_old_primary_fences_the_record_back",
        "shared/stores/fence/verdict.py",
        '    return "superseded"\n\n\ndef combined(',
        '    return "behind"\n\n\ndef combined(',
        ("tests/unit/test_postgres_fence_verdict.py",),
    ),
    Mutant(
        "a_range_leased_before_a_fence_is_copied_after_it",
        "shared/stores/postgres/cold_store.py",
        "if int(await conn.fetchval(sql.LOCK_FENCES)) != leased.fences:",
        "if False:",
        (SPLIT_BRAIN_TESTS,),
    ),
    Mutant(
        "push_ignores_its_deadline",
        "shared/stores/hot/lua/push.lua",
        "if not_after > 0 and now > not_after then",
        "if false then",
        ("tests/integration/test_push_stamp.py",),
    ),
    Mutant(
        "a_pushed_batchs_marker_dies_before_its_deadline",
        "shared/stores/hot/lua/push.lua",
        "'PX', math.max(marker_ttl, not_after - now + 1000))",
        "'PX', marker_ttl)",
        ("tests/integration/test_push_stamp.py",),
    ),
    Mutant(
        "a_server_error_ends_keygen_and_keysync",
        "shared/stores/postgres/cold_store.py",
        "    if state[:2] in CONFIGURATION_SQLSTATE_CLASSES:",
        "    if state:",
        ("tests/acceptance/test_store_errors.py",),
    ),
    Mutant(
        "a_frozen_first_host_uses_up_the_whole_connect",
        "shared/stores/postgres/connect.py",
        "    if len(hosts) <= 1:",
        "    if True:",
        ("tests/acceptance/test_postgres_outages.py",),
    ),
    Mutant(
        "ledger_use_applied_before_its_issue_is_lost",
        "shared/stores/ledger/decide.py",
        "    if waiting.keys:\n        await conn.execute(\n"
        "            ledger_sql.INSERT_EARLY_MARKS,",
        "    if False:\n        await conn.execute(\n            ledger_sql.INSERT_EARLY_MARKS,",
        ("tests/integration/test_ledger.py",),
    ),
    Mutant(
        "ledger_issue_ignores_the_uses_that_came_first",
        "shared/stores/ledger/decide.py",
        "        await _apply_early_marks(conn, name, inserted_keys, done)",
        "        pass",
        ("tests/integration/test_ledger.py",),
    ),
    Mutant(
        "ledger_entries_of_a_stopped_keysync_wait_behind_newer_ones",
        "shared/stores/ledger/stream.py",
        "                orphans = await self._claim_from_stopped(client, stream, consumer, count)",
        "                orphans: list[LedgerEntry] = []",
        ("tests/integration/test_ledger.py",),
    ),
    Mutant(
        "a_keysync_leaves_the_batch_it_holds_for_another_to_claim",
        "shared/stores/ledger/stream.py",
        "                mine = await self._own(client, stream, consumer, count)",
        "                mine: list[LedgerEntry] = []",
        ("tests/integration/test_ledger.py",),
    ),
    Mutant(
        "store_statements_keep_a_plan_made_for_an_empty_table",
        "shared/stores/postgres/connect.py",
        'SERVER_SETTINGS: Final = {"plan_cache_mode": "force_custom_plan"}',
        "SERVER_SETTINGS: Final[dict[str, str]] = {}",
        ("tests/integration/test_plans.py",),
    ),
    Mutant(
        "a_runtime_command_loads_every_plugin",
        "shared/cli/main.py",
        "    if chosen is None or chosen not in commands.choices:",
        "    if True:",
        ("tests/unit/test_cli_plugins.py",),
    ),
    Mutant(
        "a_key_at_hand_skips_the_api_key_check",
        "dispenser/single.py",
        "if source is None or not self._open or not source.at_hand:",
        "if source is None or not source.at_hand:",
        ("tests/unit/test_single.py",),
    ),
    Mutant(
        "a_key_at_hand_answers_an_idempotent_retry_anew",
        "dispenser/single.py",
        '            if headers.get("idempotency-key") is not None:\n                return None',
        "            if False:\n                return None",
        ("tests/unit/test_single.py",),
    ),
    Mutant(
        "an_alias_is_not_routed_on_the_single_id_path",
        "dispenser/service.py",
        "return {s: self.sources[n] for s, n in self.segments.items() if n in self.sources}",
        "return {s: self.sources[n] for s, n in self.segments.items() if s == n}",
        ("tests/unit/test_single.py",),
    ),
    Mutant(
        "a_use_in_one_batch_undoes_an_earlier_release",
        "shared/stores/ledger/decide.py",
        "Counter(key for each in marks.values() for key in each.keys)",
        "Counter(set(key for each in marks.values() for key in each.keys))",
        (LEDGER_RECORD_TESTS, "tests/unit/test_ledger_order.py"),
    ),
    Mutant(
        "the_in_memory_ledger_lets_any_client_mark_a_key",
        "shared/stores/memory.py",
        "        return self.open and (admin or self.issue.client == client)",
        "        return self.open",
        ("tests/integration/test_port_conformance.py",),
    ),
    Mutant(
        "a_drill_passes_with_a_fault_it_could_not_inject",
        "ops/keydispenser_ops/drill/report.py",
        "            (self.faults_not_injected == 0, f",
        "            (True, f",
        ("tests/unit/test_drill_report.py",),
    ),
    Mutant(
        "the_in_memory_hot_tier_appends_a_batch_twice",
        "shared/stores/memory.py",
        "        if batch_id in self.batches:",
        "        if False:",
        ("tests/integration/test_port_conformance.py",),
    ),
    Mutant(
        "the_lease_library_leases_from_whatever_redis_answers_locally",
        "shared/leases/holder.py",
        "    if not endpoint.named:",
        "    if False:",
        ("tests/unit/test_leases.py",),
    ),
    Mutant(
        "the_lease_library_loads_every_configuration_model",
        "shared/domain/config/__init__.py",
        "if TYPE_CHECKING:\n",
        "if True:\n",
        ("tests/integration/test_lease_distribution.py",),
    ),
    Mutant(
        "a_lease_renewal_no_replica_has_counts",
        "shared/leases/store.py",
        'return str(status) if counts or status != "renewed" else "unreplicated"',
        "return str(status)",
        ("tests/integration/test_lease_split_brain.py",),
    ),
    Mutant(
        "a_lease_grant_no_replica_has_counts",
        "shared/leases/store.py",
        "        if granted.granted and not counts:",
        "        if False:",
        ("tests/integration/test_lease_split_brain.py",),
    ),
    Mutant(
        "a_database_takes_a_second_namespace",
        "shared/stores/fence/binding.py",
        "    if bound != namespace:",
        "    if False:",
        ("tests/integration/test_binding.py",),
    ),
    Mutant(
        "a_namespace_takes_a_second_database",
        "shared/stores/fence/binding.py",
        "        if holder != database:",
        "        if False:",
        ("tests/integration/test_binding.py",),
    ),
    Mutant(
        "a_fence_may_hold_the_clock_lock_forever",
        "shared/stores/fence/postgres_fence.py",
        "        await conn.execute(fence_sql.LIMIT_FENCE, str(FENCE_LIMIT_MS))\n",
        "",
        ("tests/integration/test_postgres_fence.py",),
    ),
    Mutant(
        "a_fence_claims_a_record_redis_lost_meanwhile",
        "shared/stores/fence/lua/reset_record.lua",
        "if automatic and (rec[3] == '1' or rec[4] == '1' or (rec[5] or '') ~= seen_head) then",
        "if false then",
        ("tests/integration/test_push_stamp.py",),
    ),
    Mutant(
        "a_primary_rebuilds_the_record_beside_another_primary",
        "shared/stores/fence/postgres_fence.py",
        'if worst == "vouch" and await _another_primary(conn, cold.dsn, cold.connect_timeout_s):',
        "if False:",
        (SPLIT_BRAIN_TESTS,),
    ),
    Mutant(
        "ledger_an_early_foreign_mark_hides_the_owners",
        "shared/stores/ledger/sql.py",
        "    WHERE (early.admin OR l.client = early.used_by) AND early.used_at >= l.issued_at\n"
        "    ORDER BY",
        "    WHERE early.used_at >= l.issued_at\n    ORDER BY",
        ("tests/integration/test_ledger.py",),
    ),
    Mutant(
        "keysync_retries_a_push_past_its_deadline_after_a_sleep",
        "keysync/main.py",
        "            if self.clock() > deadline:  # checked again after every sleep",
        "            if False:",
        ("tests/unit/test_keysync_push.py",),
    ),
    Mutant(
        "push_ignores_its_pin",
        "shared/stores/hot/lua/push.lua",
        "if pin ~= '' and pin ~= token then",
        "if false then",
        ("tests/integration/test_fence.py",),
    ),
    Mutant(
        "push_not_idempotent",
        "shared/stores/hot/lua/push.lua",
        "if redis.call('EXISTS', batch_marker) == 1 then",
        "if false then",
        ("tests/integration/test_fence.py",),
    ),
    Mutant(
        "idempotency_record_not_keyed_on_the_client",
        "shared/domain/redis_keys.py",
        'digest = hashlib.sha256(f"{client}\\n{key}".encode()).hexdigest()',
        'digest = hashlib.sha256(f"{key}".encode()).hexdigest()',
        IDEMPOTENCY_TESTS,
    ),
    Mutant(
        "idempotency_replays_another_request",
        "shared/stores/hot/lua/pop_idempotent.lua",
        "if record.request ~= request or record.client ~= client then",
        "if record.client ~= client then",
        IDEMPOTENCY_TESTS,
    ),
    Mutant(
        "pop_reads_without_removing",
        "shared/stores/hot/lua/pop.lua",
        "local taken = redis.call('LPOP', hot_list, count)",
        "local taken = redis.call('LRANGE', hot_list, 0, count - 1)",
        ("tests/integration/test_pipeline.py", "tests/integration/test_dispenser.py"),
    ),
    Mutant(
        "pop_idempotent_reads_without_removing",
        "shared/stores/hot/lua/pop_idempotent.lua",
        "local taken = redis.call('LPOP', hot_list, count)",
        "local taken = redis.call('LRANGE', hot_list, 0, count - 1)",
        IDEMPOTENCY_TESTS,
    ),
    Mutant(
        "filter_sequence_misses_the_last_window",
        "shared/domain/filters.py",
        "for i in range(len(s) - limit + 1):",
        "for i in range(len(s) - limit):",
        ("tests/unit/test_filters.py",),
    ),
    Mutant(
        "filter_repeating_block_may_overlap",
        "shared/domain/filters.py",
        "return any(s[i : i + limit] in s[i + limit :] for i in range(len(s) - limit))",
        "return any(s[i : i + limit] in s[i + 1 :] for i in range(len(s) - limit))",
        ("tests/unit/test_filters.py",),
    ),
    Mutant(
        "permutation_folds_instead_of_cycle_walking",
        "shared/domain/permutation.py",
        "out[outside] = self._encrypt(out[outside])",
        "out[outside] = out[outside] % limit",
        ("tests/unit/test_permutation.py",),
    ),
    Mutant(
        "permutation_runs_one_round",
        "shared/domain/permutation.py",
        "for round_key in self._round_keys:",
        "for round_key in self._round_keys[:1]:",
        ("tests/unit/test_permutation.py",),
    ),
    Mutant(
        "fence_shared_by_every_namespace",
        "shared/domain/redis_keys.py",
        'return f"{namespace}:fence"',
        'return "kd:fence"',
        ("tests/integration/test_namespaces.py", "tests/unit/test_redis_keys.py"),
    ),
    Mutant(
        "sequential_batches_taken_in_table_order",
        "shared/stores/postgres/cold_store.py",
        "sql.TAKE_BATCH_IN_ORDER if in_order else sql.TAKE_BATCH",
        "sql.TAKE_BATCH",
        ("tests/integration/test_registry_interop.py",),
    ),
    Mutant(
        "client_retries_with_a_new_idempotency_key",
        "clients/python/keydispenser_client/aio.py",
        "reply = await self._http.post(url, headers=request_headers)",
        "reply = await self._http.post(\n"
        "                    url,\n"
        "                    headers={'Idempotency-Key': protocol.new_idempotency_key()},\n"
        "                )",
        CLIENT_TESTS,
    ),
    Mutant(
        "client_take_nowait_hands_out_a_key_twice",
        "clients/python/keydispenser_client/aio.py",
        "key = buffer.popleft()",
        "key = buffer[0]",
        CLIENT_TESTS,
    ),
    Mutant(
        "client_ignores_retry_after",
        "clients/python/keydispenser_client/protocol.py",
        'return Wait(max(waited, 0.0), f"{status} {code}", from_server=True)',
        'return Wait(0.0, f"{status} {code}", from_server=True)',
        CLIENT_TESTS,
    ),
    Mutant(
        "client_410_is_not_exhaustion",
        "clients/python/keydispenser_client/protocol.py",
        "    if status == 410:",
        "    if False:",
        CLIENT_TESTS,
    ),
    Mutant(
        "snowflake_minter_ignores_the_floor",
        "shared/domain/snowflake.py",
        "self._last_ms = max(self._last_ms, lease.floor_ms)",
        "self._last_ms = self._last_ms",
        SNOWFLAKE_TESTS,
    ),
    Mutant(
        "snowflake_minter_ignores_the_ceiling",
        "shared/domain/snowflake.py",
        "if now > lease.ceiling_ms():",
        "if False:",
        SNOWFLAKE_TESTS,
    ),
    Mutant(
        "snowflake_minter_mints_on_an_invalid_lease",
        "shared/domain/snowflake.py",
        "if lease is None or not lease.valid():",
        "if lease is None:",
        SNOWFLAKE_TESTS,
    ),
    Mutant(
        "snowflake_sequence_overflows_into_the_machine_bits",
        "shared/domain/snowflake.py",
        "taken = min(count, self.layout.sequence_limit - sequence)",
        "taken = count",
        SNOWFLAKE_TESTS,
    ),
    Mutant(
        "snowflake_minter_mints_behind_the_last_time",
        "shared/domain/snowflake.py",
        "            return last - now",
        "            return self._take(lease, now, 0, count)",
        SNOWFLAKE_TESTS,
    ),
    Mutant(
        "lease_granted_while_settling",
        "shared/leases/lua/lease_acquire.lua",
        "if now < since + ttl_max then",
        "if false then",
        LEASE_TESTS,
    ),
    Mutant(
        "lease_renewed_by_anyone",
        "shared/leases/lua/lease_renew.lua",
        "if not alive(lease, epoch, now) or lease.owner ~= owner then",
        "if not alive(lease, epoch, now) then",
        LEASE_TESTS,
    ),
    Mutant(
        "lease_released_by_anyone",
        "shared/leases/lua/lease_release.lua",
        "if lease == nil or lease.owner ~= owner then",
        "if lease == nil then",
        LEASE_TESTS,
    ),
    Mutant(
        "lease_renew_ignores_its_epoch",
        "shared/leases/lua/lease_renew.lua",
        "if granted_in ~= epoch then",
        "if false then",
        LEASE_TESTS,
    ),
    Mutant(
        "lease_holder_ignores_its_deadline",
        "shared/leases/holder.py",
        "return not self.lost.is_set() and time.monotonic() < self._deadline",
        "return not self.lost.is_set()",
        ("tests/unit/test_leases.py", *LEASE_TESTS),
    ),
    Mutant(
        "a_cluster_endpoint_asks_only_the_nodes_its_settings_list",
        "shared/stores/redis/endpoint.py",
        "others = [address for address in self._learned if address not in asked]",
        "others: list[tuple[str, int]] = []",
        (
            "tests/integration/test_redis_cluster.py::"
            "test_the_primary_is_found_through_the_cluster_after_every_given_node_is_gone",
        ),
    ),
    Mutant(
        "token_clients_of_two_issuers_share_a_name",
        "dispenser/oidc.py",
        "client = prefix + named if isinstance(named, str) else None",
        "client = named if isinstance(named, str) else None",
        ("tests/integration/test_oidc.py", "tests/unit/test_oidc.py"),
    ),
    Mutant(
        "the_jwks_refresher_waits_on_after_a_lost_cancellation",
        "dispenser/oidc.py",
        "            if self._closing:  # closed while waiting (its cancellation may be lost)\n"
        "                return\n",
        "",
        ("tests/unit/test_oidc.py",),
    ),
    Mutant(
        "an_api_key_may_take_a_token_providers_prefix",
        "shared/domain/config/dispenser.py",
        "        if taken:\n",
        "        if False:\n",
        ("tests/unit/test_oidc.py",),
    ),
    Mutant(
        "up_starts_an_embedded_redis_beside_a_named_cluster",
        "ops/keydispenser_ops/up.py",
        '        if found_by:\n            return dsn, ""\n',
        "",
        ("tests/acceptance/test_up_on_a_cluster.py",),
    ),
    Mutant(
        "up_writes_a_pretty_printed_cluster_setting_as_it_came",
        "ops/keydispenser_ops/up.py",
        'value = json.dumps(json.loads(value), separators=(",", ":"))',
        "pass",
        ("tests/acceptance/test_up_on_a_cluster.py",),
    ),
    Mutant(
        "a_lease_exit_waits_on_a_renewer_only_cancellation_stops",
        "shared/leases/holder.py",
        "        lease.end()\n        renewer.cancel()\n",
        "        renewer.cancel()\n",
        ("tests/integration/test_machine_leases.py",),
    ),
    Mutant(
        "a_lease_exit_swallows_the_callers_cancellation",
        "shared/leases/holder.py",
        "            await asyncio.wait([renewer])\n",
        "            with contextlib.suppress(asyncio.CancelledError):\n"
        "                await renewer\n",
        ("tests/integration/test_machine_leases.py",),
    ),
    Mutant(
        "the_pop_line_keeps_a_connection_whose_reply_was_not_read",
        "shared/stores/redis/script_line.py",
        "            return await connection.read_response()\n"
        "    except ResponseError:\n"
        "        raise  # an error reply, read whole: the connection is still in step\n"
        "    except BaseException as exc:\n"
        "        # redis-py closes it too on every such error; this line does not rely on that.\n"
        "        await connection.disconnect(nowait=True)\n",
        "            return await connection.read_response(disconnect_on_error=False)\n"
        "    except ResponseError:\n"
        "        raise\n"
        "    except BaseException as exc:\n",
        ("tests/integration/test_script_line.py",),
    ),
    Mutant(
        "the_pop_line_asks_for_the_client_before_it_has_the_line",
        "shared/stores/redis/script_line.py",
        "        async with self._lock:\n"
        "            if self._closed:\n"
        '                raise RedisConnectionError("this script line is closed")\n'
        "            client = await client_of()\n",
        "        client = await client_of()\n"
        "        async with self._lock:\n"
        "            if self._closed:\n"
        '                raise RedisConnectionError("this script line is closed")\n',
        ("tests/integration/test_script_line.py",),
    ),
    Mutant(
        "the_pop_line_stays_on_the_old_client",
        "shared/stores/redis/script_line.py",
        "if client is not self._client or self._connection is None:",
        "if self._connection is None:",
        ("tests/integration/test_script_line.py",),
    ),
    Mutant(
        "the_chart_gives_the_permutation_key_to_every_process",
        HELPERS,
        '{{- if has $p (list "migrate" "keygen") }}',
        "{{- if true }}",
        CHART_TESTS,
    ),
    Mutant(
        "the_chart_installs_without_a_permutation_key",
        HELPERS,
        '{{ fail "secrets.permutationKey: set existingSecret (a Secret you created, key'
        ' KD_PERMUTATION_KEY) or value" }}',
        '{{ printf "%s-permutation" (include "keydispenser.fullname" .) }}',
        CHART_TESTS,
    ),
    Mutant(
        "the_migrate_hook_is_left_for_the_operator_to_delete",
        "deploy/helm/keydispenser/templates/migrate-job.yaml",
        '"helm.sh/hook-delete-policy" "before-hook-creation,hook-succeeded"',
        '"helm.sh/hook-delete-policy" "hook-succeeded"',
        CHART_TESTS,
    ),
    Mutant(
        "a_process_uses_a_dev_stack_found_beside_it",
        "shared/cli/main.py",
        "(not long_running(args) or named_stack)",
        "True",
        ("tests/acceptance/test_first_hour.py",),
    ),
    Mutant(
        "the_client_fails_on_a_batch_above_the_keys_burst",
        "clients/python/keydispenser_client/protocol.py",
        "    if status == 422 and limit.isdigit() and int(limit) > 0:",
        "    if False:",
        CLIENT_TESTS,
    ),
    Mutant(
        "the_burst_refusal_names_no_count",
        "dispenser/envelope.py",
        "        headers = {MAX_COUNT_HEADER: str(exc.burst)}",
        "        headers = None",
        ("tests/integration/test_isolation.py", "tests/integration/test_client.py"),
    ),
    Mutant(
        "a_busy_metrics_port_waits_for_postgres",
        "shared/startup.py",
        "    serve_metrics(start.registry, host, port, start.heartbeat, setting)\n"
        "    cold = await _connected(settings, stop)\n"
        "    if cold is None:\n"
        "        return\n",
        "    cold = await _connected(settings, stop)\n"
        "    if cold is None:\n"
        "        return\n"
        "    serve_metrics(start.registry, host, port, start.heartbeat, setting)\n",
        ("tests/acceptance/test_fail_fast.py::test_a_busy_metrics_port_names_the_port",),
    ),
    Mutant(
        "a_snowflake_lease_wait_said_at_every_attempt",
        "dispenser/snowflake.py",
        "            if not self._said_settling:",
        "            if True:",
        ("tests/unit/test_snowflake_holder.py",),
    ),
    Mutant(
        "purge_takes_any_directory_of_known_names_for_a_stack",
        "ops/keydispenser_ops/up.py",
        "    if strangers or not any((data_dir / proof).exists() for proof in STACK_PROOF):",
        "    if strangers:",
        ("tests/unit/test_up.py",),
    ),
    Mutant(
        "purge_removes_the_postgres_data_a_copied_directory_names",
        "ops/keydispenser_ops/up.py",
        "or recorded != str(pgdata):",
        ":",
        ("tests/unit/test_up.py",),
    ),
    Mutant(
        "cold_empty_warned_at_every_poll",
        "keysync/main.py",
        "        if name not in self._empty:  # once per spell, not at every poll while it lasts",
        "        if True:",
        ("tests/unit/test_keysync_push.py",),
    ),
    Mutant(
        "the_dispenser_loads_the_fence_procedure",
        "shared/metrics.py",
        "from shared.domain.tiers import FenceReport\n",
        "from shared.stores.fence.postgres_fence import FenceReport\n",
        ("tests/unit/test_dispenser_imports.py",),
    ),
    Mutant(
        "a_router_forgets_the_coalesced_pop",
        "shared/stores/groups.py",
        """    async def pop_coalesced(
        self, name: str, count: int, clients: Sequence[str] = (), ledger: bool = False
    ) -> Popped:
        \"\"\"Pops for type ``name``'s one coalescing caller, on its group's own line
        (``HotStore.pop_coalesced``): the single-ID request's refill.\"\"\"
        return await self.of(name).pop_coalesced(name, count, clients, ledger)
""",
        "",
        ("tests/unit/test_routers.py",),
    ),
    Mutant(
        "crockford32_reads_no_other_spelling",
        "shared/domain/formats/crockford32.py",
        "        return super().normalise(core).translate(_READ)",
        "        return super().normalise(core)",
        ("tests/unit/test_crockford32.py",),
    ),
    Mutant(
        "a_ledger_lookup_takes_the_key_as_typed",
        "dispenser/routes.py",
        '    key = id_type.normalise(request.path_params["key"])',
        '    key = request.path_params["key"]',
        ("tests/integration/test_crockford32.py",),
    ),
    Mutant(
        "mosips_put_records_the_uin_as_typed",
        "dispenser/mosip.py",
        "    uin = id_type.normalise(given)",
        "    uin = given",
        ("tests/integration/test_crockford32.py",),
    ),
    Mutant(
        "a_mark_of_use_records_the_key_as_typed",
        "dispenser/routes.py",
        "    return id_type.normalise(value) if isinstance(id_type, IdType) else value",
        "    return value",
        ("tests/integration/test_crockford32.py",),
    ),
    Mutant(
        "an_interrupted_connection_goes_back_to_the_pool",
        "shared/stores/postgres/cold_store.py",
        "            conn.terminate()\n    try:",
        "            pass\n    try:",
        ("tests/integration/test_interrupted_connections.py",),
    ),
    Mutant(
        "a_login_the_pooler_refuses_is_taken_for_an_outage",
        "shared/stores/postgres/cold_store.py",
        "    if state == POOLER_LOGIN_REFUSAL and _message(exc).startswith(POOLER_SETUP_REFUSALS):",
        "    if False:",
        (PGBOUNCER_TESTS,),
    ),
    Mutant(
        "keysync_s_redis_user_cannot_push",
        "shared/stores/redis/acl.py",
        '        "rpush",\n        "sadd",',
        '        "sadd",',
        (REDIS_ACL_TESTS,),
    ),
    Mutant(
        "every_redis_user_may_flush_everything",
        "shared/stores/redis/acl.py",
        'CONNECTION: Final = frozenset({"ping", "hello", "select"})',
        'CONNECTION: Final = frozenset({"ping", "hello", "select", "flushall"})',
        (REDIS_ACL_TESTS,),
    ),
    Mutant(
        "a_postgres_certificate_refused_is_retried_as_an_outage",
        "shared/stores/postgres/cold_store.py",
        "    if isinstance(exc, ssl.SSLCertVerificationError):  # a setup to fix, not an outage",
        "    if False:",
        ("tests/acceptance/test_tls.py",),
    ),
    Mutant(
        "a_redis_certificate_refused_is_retried_as_an_outage",
        "shared/stores/redis/scripts.py",
        "            if refused is not None:\n                raise self._endpoint",
        "            if False:\n                raise self._endpoint",
        ("tests/acceptance/test_tls.py",),
    ),
    Mutant(
        "a_synchronous_promotion_that_lost_commits_passes_the_drill",
        "ops/keydispenser_ops/drill/runner.py",
        '        if not self.stack.get("synchronous_mode"):\n            return []',
        "        if True:\n            return []",
        ("tests/unit/test_drill_report.py",),
    ),
    Mutant(
        "a_process_not_told_of_transaction_pooling_starts",
        "shared/stores/postgres/connect.py",
        'if pooler != "transaction" and await pooled_per_transaction(dsn, host_timeout_s):',
        "if False:",
        (PGBOUNCER_TESTS,),
    ),
    Mutant(
        "named_statements_behind_a_transaction_pooler",
        "shared/stores/postgres/connect.py",
        '    if pooler == "none":\n        return {"server_settings": dict(SERVER_SETTINGS)}',
        '    if True:\n        return {"server_settings": dict(SERVER_SETTINGS)}',
        (PGBOUNCER_TESTS,),
    ),
    Mutant(
        "keygen_generates_excluded_ids",
        "shared/stores/postgres/cold_store.py",
        "    if not rows:\n        return keys",
        "    if True:\n        return keys",
        (IMPORT_TESTS,),
    ),
    Mutant(
        "import_leaves_excluded_ids_in_the_cold_table",
        "shared/stores/postgres/imports.py",
        "done.cold_removed = int(await conn.fetchval(self._sql(sql.DELETE_STAGED_COLD)))",
        "done.cold_removed = 0",
        (IMPORT_TESTS,),
    ),
    Mutant(
        "a_killed_import_starts_over",
        "shared/stores/postgres/imports.py",
        '            if row is not None and origin is not None and row["origin"] == origin:',
        "            if False:",
        (IMPORT_TESTS,),
    ),
    Mutant(
        "a_killed_import_resumed_from_another_file",
        "shared/cli/imports.py",
        '    origin = None if path == "-" else f"{_identity(path)} --status {status}"',
        '    origin = None if path == "-" else f"{path} --status {status}"',
        (IMPORT_TESTS,),
    ),
    Mutant(
        "a_killed_import_resumed_under_other_type_settings",
        "shared/cli/imports.py",
        "    run = await target.resume(_with_type(plan.origin, id_type), intake.counts())",
        "    run = await target.resume(plan.origin, intake.counts())",
        (IMPORT_TESTS,),
    ),
    Mutant(
        "the_excluded_ahead_not_counted_again_after_an_import",
        "shared/stores/postgres/cold_store.py",
        "        if cached is not None and cached[0] == epoch and cached[1] <= first:",
        "        if cached is not None and cached[1] <= first:",
        (IMPORT_TESTS,),
    ),
    Mutant(
        "the_excluded_leased_past_still_counted_ahead",
        "shared/stores/postgres/cold_store.py",
        "            ahead = cached[2] - int(passed)",
        "            ahead = cached[2]",
        (IMPORT_TESTS,),
    ),
    Mutant(
        # fsynced counts the primary's own append-only file only: a replica that
        # copies the record but writes no AOF is taken for one that does.
        "fsynced_counts_no_replica",
        "shared/stores/ledger/stream.py",
        "            return local >= 1 and remote >= replicas",
        "            return local >= 1",
        ("tests/integration/test_ledger_durability.py",),
    ),
    Mutant(
        "import_leaves_excluded_ids_in_the_hot_list",
        "shared/cli/imports.py",
        "            if found:",
        "            if False:",
        (IMPORT_TESTS,),
    ),
    Mutant(
        "a_batch_taken_before_an_import_lands_after_it",
        "shared/stores/hot/lua/push.lua",
        "if epoch < tonumber",
        "if false and epoch < tonumber",
        (IMPORT_TESTS,),
    ),
    Mutant(
        "a_batch_taken_before_an_import_lands_on_a_new_primary",
        "keysync/main.py",
        "            return await self._cold.import_epoch(name) > epoch",
        "            return False",
        ("tests/unit/test_keysync_push.py",),
    ),
    Mutant(
        "a_stock_is_kept_after_an_import",
        "dispenser/sources.py",
        "        if self._epoch is not None and epoch != self._epoch:",
        "        if False:",
        (IMPORT_TESTS, "tests/unit/test_pool.py"),
    ),
    Mutant(
        "a_stale_stock_is_handed_out",
        "dispenser/sources.py",
        "        if not stock or not self._fresh():",
        "        if not stock:",
        ("tests/unit/test_pool.py",),
    ),
    Mutant(
        "a_requeue_puts_an_excluded_id_back",
        "shared/stores/ledger/sql.py",
        "OR EXISTS (SELECT 1 FROM kd_excluded AS e WHERE e.id_type = $1 AND e.key = r.key)",
        "OR false",
        (IMPORT_TESTS,),
    ),
)


def scratch_copy(dest: Path) -> None:
    """The repository's tracked and untracked-but-not-ignored files, copied to ``dest``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def environment(copy: Path) -> dict[str, str]:
    # No bytecode: a restored file can have the mutant's size and mtime second.
    # The client and the operator tooling are distributions of their own, a folder down.
    path = os.pathsep.join((str(copy), str(copy / "clients" / "python"), str(copy / "ops")))
    return os.environ | {"PYTHONPATH": path, "PYTHONDONTWRITEBYTECODE": "1"}


def imports_from(copy: Path) -> None:
    """Refuse to run when the copy's packages would not shadow the installed ones."""
    probe = (
        "import shared, keysync, keygen, dispenser, keydispenser_client, keydispenser_ops; "
        "print(shared.__file__); print(keydispenser_client.__file__); "
        "print(keydispenser_ops.__file__)"
    )
    found = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=copy,
        env=environment(copy),
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.split()
    for where in found:
        if not Path(where).resolve().is_relative_to(copy.resolve()):
            raise SystemExit(f"mutants: the scratch copy imports {where}, not its own files")


def run_tests(
    copy: Path,
    tests: Sequence[str],
    options: Sequence[str] = (),
    deadline_s: float = RUN_DEADLINE_S,
) -> tuple[int, str, str]:
    """pytest's exit code (0 all passed, 1 some failed, anything else an error), the
    first failed test's id, and the end of pytest's output."""
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-rf", "-p", "no:cacheprovider"]
    try:
        done = subprocess.run(
            [*command, *options, *tests],
            cwd=copy,
            env=environment(copy),
            capture_output=True,
            text=True,
            timeout=deadline_s,
        )
    except subprocess.TimeoutExpired:
        return -1, "", f"no result within {deadline_s} s"
    failed = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("FAILED ")]
    return done.returncode, failed[0] if failed else "", (done.stdout + done.stderr)[-6000:]


def mutate(copy: Path, mutant: Mutant) -> str | None:
    """Apply ``mutant``; the original text, or None when its line is not there once."""
    path = copy / mutant.path
    original = path.read_text()
    if original.count(mutant.before) != 1:
        return None
    path.write_text(original.replace(mutant.before, mutant.after))
    return original


def verdict(copy: Path, mutant: Mutant) -> tuple[str, str]:
    """killed / SURVIVED / not applied / error, and the test that killed it."""
    original = mutate(copy, mutant)
    if original is None:
        return "not applied", ""
    try:
        code, killer, _ = run_tests(copy, mutant.tests)
    finally:
        (copy / mutant.path).write_text(original)
    return {0: "SURVIVED", 1: "killed"}.get(code, f"error (pytest exit {code})"), killer


def chosen(names: Sequence[str]) -> list[Mutant]:
    known = {m.name: m for m in MUTANTS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"mutants: unknown {', '.join(unknown)}; known: {', '.join(known)}")
    return [known[n] for n in names] if names else list(MUTANTS)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("names", nargs="*", help="mutants to run (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = parser.parse_args(argv)
    if args.list:
        for m in MUTANTS:
            print(f"{m.name:62} {m.path}")
        return 0
    mutants = chosen(args.names)
    with tempfile.TemporaryDirectory(prefix="kd-mutants-") as tmp:
        copy = Path(tmp)
        scratch_copy(copy)
        imports_from(copy)
        tests = sorted({t for m in mutants for t in m.tests})
        code, first_failure, output = run_tests(copy, tests, BASELINE_WORKERS, BASELINE_DEADLINE_S)
        if code != 0:
            print(output, file=sys.stderr)
            print(
                "mutants: the tests fail without any mutation; fix them first "
                f"(first failure: {first_failure or 'an error before any test'})"
            )
            return 2
        failed = 0
        for mutant in mutants:
            started = time.monotonic()
            result, killer = verdict(copy, mutant)
            failed += result != "killed"
            took = time.monotonic() - started
            print(f"{result:8} {mutant.name:60} {took:5.1f}s  {killer or ' '.join(mutant.tests)}")
            sys.stdout.flush()
    print(f"mutants: {len(mutants) - failed} of {len(mutants)} killed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
