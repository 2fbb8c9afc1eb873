//go:build !race

package srtpflow

const raceEnabled = false
