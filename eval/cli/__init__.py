"""eval's commands, which ``memfree`` (:mod:`memfree.cli`) loads when they are named.

evaluate.py   memfree eval discoverable|styles (defaults: ExperimentSettings)
utility.py    memfree eval utility
audit.py      memfree audit insert|extractable|exposure|extract (defaults: AuditSettings)
audit_options.py  its options, and the AuditSettings its parsed options make
"""
