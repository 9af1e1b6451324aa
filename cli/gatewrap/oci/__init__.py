"""``gatewrap-oci``: an OCI runtime (runtime-spec 1.0, the command line of runc(8)) that
delegates to runc and puts each container in a gatewrap sandbox served by the daemon.

- :mod:`.argv`: runc's command line, split into its global flags, command and arguments.
- :mod:`.bundle`: what ``create`` checks and changes in the bundle's ``config.json``.
- :mod:`.main`: the console script (short-lived; imports little).
- :mod:`.runs`: the daemon's side: a container's run set up on ``create``, torn down on ``delete``.
"""
