"""Results as data, the verdict as pure functions, and the one judge loop; imports no torch."""
