"""How one configuration is measured: a trial process (runner) started as its launch says
(``launch``: the command and environment the emitted launch.sh uses too), the worker inside
it, their protocol, the machine-wide measurement lock and process-tree bookkeeping."""
