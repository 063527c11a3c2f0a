"""Reports built from run folders only (so they can be regenerated without rerunning)."""
