//go:build race

package slowpath

// raceEnabled: the race detector runs (sync.Pool then drops items at
// random, so allocation counts mean nothing).
const raceEnabled = true
