"""`trainbench probe`: measure the hardware a benchmark runs on.

Every rank at once measures dense GEMM throughput per dtype at the seed workloads'
shapes and its memory bandwidth (a large copy); then the ranks sweep the collectives
(all-reduce, all-gather, reduce-scatter, all-to-all, send/recv) over message sizes,
inside each node and, with several nodes, across nodes. The result is a versioned
`hardware-profile.json` with a health verdict (a rank, group or node more than 5% below
its peers), a table and a bandwidth-vs-size PNG.

Modules: `profile` (torch-free arithmetic: sizes, bus bandwidth, verdict, the profile's
format), `request` (options checked, probe directory, torchrun or Slurm), `worker` (what
each rank runs, `python -m trainbench.probe.worker DIR/probe-plan.json`), `report`
(table and plot), `cli` (the command).
"""
