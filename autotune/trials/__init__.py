"""How one configuration is measured: a trial process (runner), the worker inside it, their
protocol, the machine-wide measurement lock and process-tree bookkeeping."""
