// Package mq is ubkit's message queue for the super node: [Log], a topic
// of partitions, each an append-only log in shared-memory segments (package
// shm) that producers and consumers of many processes on one host share.
// A producer loans space in place ([Log.Loan], or many records at once with
// one claim: [Log.LoanBatch]), fills it and commits it, or copies a payload
// in ([Log.Send]); a [Reader] with its own offset reads committed records
// in place.
//
// Around the log:
//   - Durability: a log created with Config.Dir keeps its segments in
//     memory-mapped files with a flush policy (FlushNone, FlushInterval,
//     FlushEverySend), and [OpenDir] rebuilds it after every process died;
//     Config.MaxAge adds retention by age to retention by size.
//   - Consumer groups ([Log.JoinGroup]): partitions shared among member
//     processes and rebalanced when one joins or dies, with ack, nack,
//     redelivery after a visibility timeout and a dead-letter log.
//   - Across the super node: [Serve] and [DialReader] stream a partition
//     to a reader on another node over package transport, and [Replicate]
//     and [Follow] replicate a partition into a follower's log: the leader
//     writes its segments' bytes with one-sided ub writes straight into
//     the follower's own segments, which the follower checks and
//     publishes.
//
// Every word mq reads from shared memory, files or the wire may have been
// written by a process that is buggy, hostile or dead: headers, lengths and
// offsets are validated and a bad one is an error wrapping shm.ErrCorrupt
// (or a wire error), never a panic. A producer killed while it holds a loan
// leaves a record that stays "writing"; a reader that meets it finds its
// writer dead, marks it aborted and skips it (Stats.Aborted counts them),
// so a dead producer never blocks a partition nor shows a torn record.
//
// The Pulsar and RocketMQ drop-ins live in the subpackages; docs/mq.md has
// the design, the guarantees and what is not written yet.
package mq
