// Package bench is the harness behind `ubctl bench`: it runs ubkit and its
// baselines side by side in one invocation, interleaved round by round, each
// contender as a pair of processes, and reports medians and spreads, and
// how ubkit compares with each baseline in words ("211x faster", "adds
// 35 µs less"), as a table or as JSON.
//
// A suite registers peer roles (the code the second process runs) with
// RegisterPeer; a program that hosts suites calls RunPeerIfChild first thing
// in main (or TestMain) so that re-executing itself turns it into the peer.
package bench
