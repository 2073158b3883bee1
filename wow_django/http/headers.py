"""The request headers of the command routes, named as Wow's REST API names them (``CommandHeaders``).

The tenant header belongs to the tenant resolver (:mod:`wow_django.http.tenancy`).
"""

WAIT_STAGE_HEADER = "Command-Wait-Stage"  # SENT | PROCESSED (default) | SNAPSHOT | PROJECTED | EVENT_HANDLED | SAGA_HANDLED
WAIT_CONTEXT_HEADER = "Command-Wait-Context"  # the context whose followers to wait for: this service's own only
WAIT_PROCESSOR_HEADER = "Command-Wait-Processor"  # wait for this follower only (PROJECTED, EVENT_HANDLED, SAGA_HANDLED)
WAIT_FUNCTION_HEADER = "Command-Wait-Function"  # wait for the followers whose function has this name only
WAIT_TAIL_PREFIX = "Command-Wait-Tail-"  # Wow's waits for a command a saga sends: refused (not supported)
WAIT_TIMEOUT_HEADER = "Command-Wait-Timeout"  # whole milliseconds; at most WOW["COMMAND_WAIT_TIMEOUT_S"]
REQUEST_ID_HEADER = "Command-Request-Id"  # idempotency key of a command; a create command's id derives from it
AGGREGATE_VERSION_HEADER = "Command-Aggregate-Version"  # the version the command expects the aggregate at
AGGREGATE_ID_HEADER = "Command-Aggregate-Id"  # a create command's aggregate id, chosen by the client
OWNER_ID_HEADER = "Command-Owner-Id"  # the owner of what the command creates (a permission lets one name another)
MAX_WAIT_TIMEOUT_MS = 2**31 - 1  # the largest Command-Wait-Timeout read (then capped by COMMAND_WAIT_TIMEOUT_S)
