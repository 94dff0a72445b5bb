from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.domain.permutation import FeistelPermutation, derive_key, key_digest


@pytest.mark.parametrize("domain", [1, 2, 3, 7, 10, 62, 100, 999, 1000, 3844, 10_000, 65_537])
def test_bijective_on_small_domains_exhaustively(domain: int) -> None:
    perm = FeistelPermutation(b"k", domain)
    image = perm.permute(np.arange(domain, dtype=np.uint64))
    assert image.max() < domain
    assert np.unique(image).size == domain


@given(st.integers(1, 10**18), st.binary(min_size=1, max_size=32), st.data())
def test_images_stay_in_domain_and_distinct(domain: int, key: bytes, data: st.DataObject) -> None:
    perm = FeistelPermutation(key, domain)
    counters = data.draw(st.sets(st.integers(0, domain - 1), min_size=1, max_size=50))
    image = perm.permute(np.array(sorted(counters), dtype=np.uint64))
    assert int(image.max()) < domain
    assert np.unique(image).size == len(counters)


def test_keys_change_the_order() -> None:
    a = FeistelPermutation(b"one", 10**9).permute(np.arange(100, dtype=np.uint64))
    b = FeistelPermutation(b"two", 10**9).permute(np.arange(100, dtype=np.uint64))
    assert (a != b).sum() > 95


def test_consecutive_counters_are_not_consecutive_keys() -> None:
    image = FeistelPermutation(b"k", 10**9).permute(np.arange(1000, dtype=np.uint64))
    steps = np.diff(image.astype(np.int64))
    assert (np.abs(steps) == 1).sum() == 0


def test_derived_keys_differ_per_type_and_digest_hides_key() -> None:
    k1, k2 = derive_key(b"s", "farmer"), derive_key(b"s", "shortlink")
    assert k1 != k2
    assert key_digest(k1) != key_digest(k2)
    assert k1.hex() not in key_digest(k1)


def test_permute_one_agrees_with_permute() -> None:
    perm = FeistelPermutation(b"k", 123_456)
    assert perm.permute_one(42) == int(perm.permute(np.array([42], dtype=np.uint64))[0])


# Frozen images. Ranges are leased by counter, so a permutation that changed between
# releases would map new counters onto keys already handed out: duplicates. Any
# change to rounds, round keys, mixing or cycle-walking must fail here.
FROZEN = [
    (b"k", 123_456, [42601, 86123, 27812, 110803]),
    (b"farmer", 10**10, [217394555, 4200134193, 1519108010, 5909419416]),
    (b"shortlink", 62**7, [1195471081694, 438505357749, 1406048027724, 987086683347]),
    (
        b"k",
        2**64,
        [4489202313116040402, 3257843024347057732, 1731292592192112580, 5707688651880576464],
    ),
]


@pytest.mark.parametrize(("key", "domain", "images"), FROZEN)
def test_images_never_change_between_releases(key: bytes, domain: int, images: list[int]) -> None:
    perm = FeistelPermutation(key, domain)
    counters = [0, 1, 42, domain - 1]
    assert [perm.permute_one(c) for c in counters] == images
    assert perm.permute(np.array(counters, dtype=np.uint64)).tolist() == images


def test_generation_blocks_cover_the_slice_once() -> None:
    from keygen.generation import MAX_BLOCK, blocks

    for start, stop, threads in [(0, 1, 2), (5, 100_000, 2), (0, 1 << 20, 2), (7, 3 << 21, 4)]:
        parts = blocks(start, stop, threads)
        assert parts[0][0] == start and parts[-1][1] == stop
        assert all(a < b for a, b in parts)
        assert all(b == c for (_, b), (c, _) in itertools.pairwise(parts))
        assert all(b - a <= MAX_BLOCK for a, b in parts)
    assert len(blocks(0, 1 << 20, 2)) == 2
