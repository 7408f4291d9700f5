"""Party logic: one code path per role, used by local and multi-host runs alike."""
