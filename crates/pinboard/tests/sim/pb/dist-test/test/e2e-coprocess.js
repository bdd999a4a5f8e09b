// Placeholder: the sim checks that this file exists (PINNED_PINBOARD_DIR);
// tests/sim/node runs `pinboard sim-coprocess` instead of it.
