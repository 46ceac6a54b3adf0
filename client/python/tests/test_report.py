"""The job's own table from Python: loops timed by ``shardcache.timed`` read through the
spoke as their job; ``Client.report`` has every step in the seed's phases, each step's
wait its slowest rank's, the rank that waited named, and the job's reads counted; a
spoke that is gone fails no loop."""

import time

import shardcache


def steps(table):
    return sum(p["steps"] for p in table["phases"])


def test_a_timed_loop_is_in_the_spokes_table_of_its_job(spoke):
    client = shardcache.Client(spoke)
    client.set_job("py-timed", 0)

    def batches(rank):
        for i in range(120):
            if rank == 1:
                time.sleep(0.003)  # rank 1's loader is the slow one
            yield [client.read("c4", "shard-00000.bin", (i % 16) * 16384, 16384) for _ in range(4)]

    for rank in (0, 1):
        seen = sum(1 for _ in shardcache.timed(batches(rank), client, "py-timed", rank=rank, ranks=2))
        assert seen == 120
    table = client.report("py-timed")
    for _ in range(200):
        if steps(table) >= 120:
            break
        time.sleep(0.05)
        table = client.report("py-timed")
    assert [(p["epoch"], p["phase"], p["steps"]) for p in table["phases"]] == [
        (0, "batches 0-100", 100), (0, "batches 100-150", 20)]
    assert (table["job"], table["ranks"]) == ("py-timed", 2)
    for phase in table["phases"]:
        assert phase["samples"] == phase["steps"] * 8, "both ranks' samples"
        assert phase["slowest_rank"] == 1, phase
        assert 0 < phase["data_wait_pct"] < 100 and abs(phase["gpu_util_pct"] + phase["data_wait_pct"] - 100) < 1e-6
    assert sum(p["reads"] for p in table["phases"]) == 2 * 120 * 4, "every read of the job counted"
    assert "| epoch 0, batches 0-100 | 100 |" in table["markdown"]


def test_another_job_has_no_table_and_a_spoke_gone_costs_the_loop_nothing(spoke):
    client = shardcache.Client(spoke)
    try:
        client.report("never-ran")
        raise AssertionError("a job that never ran has no table")
    except shardcache.ShardcacheError as e:
        assert e.code == "NOT_FOUND" and "StepTimer" in e.message, e
    # Every report fails (nothing listens there): the loop still gets every batch, and
    # nothing is raised into it.
    gone = shardcache.Client("http://127.0.0.1:1")
    assert sum(1 for _ in shardcache.timed(range(50), gone, "nowhere", rank=0, ranks=1, samples=lambda b: 1)) == 50
