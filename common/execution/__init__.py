"""Where the work runs (design §7, docs/architecture.md "Executors"): the executor
interface and the local executors, serial, threads and a `spawn` process pool (`parallel`),
the Dask executor for a cluster (`dask_executor`), the factory that turns `--executor` or
``PPRE_EXECUTOR`` into one of them and the one module that names every implementation
(`executors`), and the hardening of every process that may hold a secret: no core dumps,
not dumpable, locked memory (`memory`). A service injects an executor into its session;
the executor runs whatever picklable task it is handed and knows nothing of keys, metrics,
sessions or the network, so the modules of this package import nothing of the project but
`common.errors` and each other (`executors` -> `dask_executor` -> `parallel` -> `memory`,
never back), a rule that tests/test_layering.py holds.
"""
