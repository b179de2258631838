"""eval's commands, which ``memfree`` (:mod:`memfree.cli`) loads when they are named.

evaluate.py          memfree eval discoverable|styles
evaluate_options.py  its options (defaults: ExperimentSettings), and the settings they make
utility.py           memfree eval utility
audit.py             memfree audit insert|extractable|exposure|extract
audit_options.py     its options (defaults: AuditSettings), and the settings they make
flags.py             the one table of settings fields and the flags that set them
"""
