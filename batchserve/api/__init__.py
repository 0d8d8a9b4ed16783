"""The HTTP API: routes, schemas, problem+json errors, admission."""
