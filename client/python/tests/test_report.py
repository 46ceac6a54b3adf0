"""The job's own table from Python: loops timed by ``shardcache.timed`` read through the
spoke as their job; ``Client.report`` has every step in the seed's phases, each step's
wait its slowest rank's (what the loops' own clocks measured around their waits), the
rank that waited named, and the job's reads counted; a spoke that is gone fails no
loop."""

import time

import shardcache


def steps(table):
    return sum(p["steps"] for p in table["phases"])


def test_a_timed_loop_is_in_the_spokes_table_of_its_job(spoke):
    client = shardcache.Client(spoke)
    client.set_job("py-timed", 0)

    # Each rank's own clock, per step: (its wait, its step from one ask to the next).
    clocks = {0: [], 1: []}

    def batches(rank):
        for i in range(120):
            asked = time.monotonic()
            if rank == 1:
                time.sleep(0.003)  # rank 1's loader is the slow one
            batch = [client.read("c4", "shard-00000.bin", (i % 16) * 16384, 16384) for _ in range(4)]
            clocks[rank].append([time.monotonic() - asked, asked])
            yield batch

    for rank in (0, 1):
        seen = 0
        for _ in shardcache.timed(batches(rank), client, "py-timed", rank=rank, ranks=2):
            time.sleep(0.002)  # the step's compute
            seen += 1
        ended = time.monotonic()
        steps_of = clocks[rank]
        for i, step in enumerate(steps_of):
            step[1] = (steps_of[i + 1][1] if i + 1 < len(steps_of) else ended) - step[1]
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
    for phase, (first, end) in zip(table["phases"], [(0, 100), (100, 120)]):
        assert phase["samples"] == phase["steps"] * 8, "both ranks' samples"
        assert phase["slowest_rank"] == 1, phase
        # A step waits for its slowest rank: the loops' own clocks, folded the same way.
        waited = sum(max(clocks[r][i][0] for r in (0, 1)) for i in range(first, end))
        stepped = sum(max(clocks[r][i][1] for r in (0, 1)) for i in range(first, end))
        measured = 100 * waited / stepped
        assert abs(phase["data_wait_pct"] - measured) <= 3, (phase, measured)
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
