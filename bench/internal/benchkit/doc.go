// Package benchkit holds what the programs under bench/ share: a private
// redis-server, worker child processes driven over a line protocol, the
// benchmark app and its events, Redis command counts (INFO commandstats),
// percentiles, process memory and machine load, and table output.
//
// It is internal to bench/: none of it is part of Relay's API, and nothing
// in it is used by the library or the relay binary. Workers run as child
// processes of the benchmark program (the program re-executes itself), so
// that a worker's CPU time, heap and RSS are its own, as they are for relay
// start, and not mixed with the event producer's or the measuring loop's.
package benchkit
