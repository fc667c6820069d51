"""birch's benchmark harness: the seeds' experiments on kernel btrfs, ext4,
xfs and birch in one run.  See bench/README.md; run it through `bench/run`.

The package is split so that each part can be read, changed and tested on its
own, and so that nothing lives in module-level state (everything a run owns
is in one `RunContext`, passed explicitly):

- `options`   command line → resolved `Options` (pure; tested without root)
- `context`   `RunContext`: options, log, child processes, live resources,
              results; what every other part is handed
- `procs`     running commands in their own process groups, signals
- `host`      mounts and loop devices of the machine, sweeping leftovers
- `install`   installing missing tools with apt-get
- `setups/`   one module per filesystem setup (btrfs, ext4, xfs on a loop
              device; birch through FUSE, DUP or single metadata)
- `workloads/` one module per workload behind the `Workload` interface
              (dbench, dirlog = seed 003, untar = seed 004, fio, embedded)
- `runner`    the run: lock, sweep, measure in order, clean up, report
- `meta`      machine and tool versions recorded with the results
- `paths`     where the bench and its checkout are
- `parsers`   dbench/fio/birch-stats output parsers (pure)
- `report`    report.md and plots from results.json (pure but for the plots)
"""
