//go:build race

package cron

// raceEnabled is true in -race builds, where pure computations run about
// ten times slower and gain nothing from the detector.
const raceEnabled = true
