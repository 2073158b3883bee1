"""The request headers the API reads (the tenant header belongs to the tenant resolver)."""

WAIT_STAGE_HEADER = "Wow-Wait-Stage"  # SENT | PROCESSED (default) | SNAPSHOT | PROJECTED
REQUEST_ID_HEADER = "Wow-Request-Id"  # idempotency key of a command; a create command's id derives from it
