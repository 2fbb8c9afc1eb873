//go:build !race

package slowpath

const raceEnabled = false
