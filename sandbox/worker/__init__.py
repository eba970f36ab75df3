"""The isolated worker: runs one candidate policy behind a pipe (see docs/sandbox.md).

These modules run in a separate interpreter started by sandbox/process.py, imported there
as a package of their own (not as `sandbox.worker`), so the worker never imports the
simulator or the rest of `sandbox`: its address space holds no trace, no PCB and no
simulator object. Everything it needs to know (the observation schema, the policy base
classes, the import allow-list, the limits) arrives as plain data at start-up.

  syscalls.py  syscall numbers and the seccomp-BPF allow lists
  harden.py    the kernel boundary, in place before the first byte of candidate code runs
  views.py     observation views rebuilt from plain rows
  serve.py     the candidate's namespace, the audit tripwire, loading and the answer loop

Keep this file free of imports: the test process imports it as `sandbox.worker`.
"""
