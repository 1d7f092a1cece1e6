"""KV block pool: all-or-nothing allocation, reference counts, integrity checks."""

from __future__ import annotations

import pytest

from server.engine.block_pool import BlockPool, NoFreeBlocksError


def test_allocate_share_free() -> None:
    pool = BlockPool(8, block_size=16)
    assert pool.can_allocate(8) and not pool.can_allocate(9)
    a = pool.allocate(3)
    assert len(set(a)) == 3 and pool.num_used == 3 and pool.usage == 3 / 8
    pool.share(a[:1])
    assert pool.ref_count(a[0]) == 2
    assert pool.free(a) == 2  # a[0] still has a holder
    assert pool.num_used == 1
    assert pool.free(a[:1]) == 1
    assert pool.num_free == 8
    pool.check_integrity()


def test_allocation_is_all_or_nothing() -> None:
    pool = BlockPool(4)
    pool.allocate(3)
    with pytest.raises(NoFreeBlocksError):
        pool.allocate(2)
    assert pool.num_free == 1
    assert pool.allocate(0) == []
    pool.check_integrity()


def test_double_free_and_sharing_a_free_block_are_refused() -> None:
    pool = BlockPool(4)
    (b,) = pool.allocate(1)
    pool.free([b])
    with pytest.raises(ValueError):
        pool.free([b])
    with pytest.raises(ValueError):
        pool.share([b])
    pool.check_integrity()


def test_integrity_detects_corruption() -> None:
    pool = BlockPool(4)
    a = pool.allocate(2)
    pool._ref_counts[a[0]] = 0  # leaked: neither free nor held
    with pytest.raises(AssertionError):
        pool.check_integrity()
    pool = BlockPool(4)
    pool._free.append(pool._free[0])
    with pytest.raises(AssertionError):
        pool.check_integrity()
