#!/usr/bin/python3
"""torch.distributed (gloo) send/recv of fp32 tensors between two processes over loopback, for
bench/transport_bench. Prints one line per size: size_mb=<n> gbps=<GB/s> (median of repeats, from
send to the receiver's ack)."""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, sizes, port, queue):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    ack = torch.zeros(1)
    for mb in sizes:
        x = torch.ones(mb * (1 << 18))
        reps = 5 if mb >= 256 else (15 if mb >= 16 else 50)
        times = []
        for i in range(reps + 1):
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(x, 1)
                dist.recv(ack, 1)
            else:
                dist.recv(x, 0)
                dist.send(ack, 0)
            if i > 0:
                times.append(time.perf_counter() - t0)
        if rank == 0:
            queue.put(f"size_mb={mb} gbps={mb * (1 << 20) / statistics.median(times) / 1e9:.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--sizes-mb", default="1,16,256")
    sizes = [int(s) for s in p.parse_args().sizes_mb.split(",") if int(s) > 0]
    q = mp.get_context("spawn").SimpleQueue()
    mp.spawn(run, args=(sizes, 29517, q), nprocs=2)
    while not q.empty():
        print(q.get())
