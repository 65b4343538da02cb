"""Pure, typed building blocks shared by both parties (design §2-§5).

`common` never imports `tester_service` or `client_service`; it does no I/O
except where a module says so (reading packaged Census tables, data files).
"""
