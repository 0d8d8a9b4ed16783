"""Shared domain code: settings, tables, the job store, broker topology and notifications."""
