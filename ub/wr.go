package ub

import "fmt"

// Opcode is a work request's operation (URMA_OPC_*).
type Opcode uint8

const (
	OpWrite    Opcode = iota + 1 // one-sided store into a remote segment
	OpWriteImm                   // Write, then a completion with Imm at the target
	OpRead                       // one-sided load from a remote segment
	OpSend                       // two-sided: into the target's next posted receive
	OpSendImm                    // Send carrying Imm
	OpCAS                        // compare-and-swap of a remote 8-byte word
	OpFetchAdd                   // fetch-and-add on a remote 8-byte word
	OpRecv                       // a receive completed (completions only)
)

var opNames = [...]string{"", "write", "write-imm", "read", "send", "send-imm", "cas", "fetch-add", "recv"}

func (o Opcode) String() string {
	if int(o) < len(opNames) && o != 0 {
		return opNames[o]
	}
	return fmt.Sprintf("Opcode(%d)", uint8(o))
}

// Local names bytes of a local segment.
type Local struct {
	Seg    Segment
	Offset int
	Len    int
}

// Remote names a place in an imported segment.
type Remote struct {
	Seg    RemoteSegment
	Offset int
}

// WR is a work request.
//
//   - Write/WriteImm: copy Local to Remote (WriteImm also delivers Imm and
//     consumes one posted receive at Target).
//   - Read: copy Len bytes of Remote into Local.
//   - Send/SendImm: copy Local into Target's next posted receive.
//   - CAS: if the word at Remote equals Compare, store Swap; FetchAdd: add
//     Add. Both return the previous value in Completion.Value and, when
//     Local.Seg is set, store it little-endian at Local.
type WR struct {
	Op      Opcode
	UserCtx uint64
	Local   Local
	Remote  Remote
	// Target is where sends (and WriteImm's notification) go; nil means the
	// jetty's bound target.
	Target  Target
	Imm     uint64
	Compare uint64
	Swap    uint64
	Add     uint64
}

// RecvWR posts a receive buffer.
type RecvWR struct {
	UserCtx uint64
	Buf     Local
}

// Status is a completion's outcome (mapped onto URMA_CR_* meanings).
type Status uint8

const (
	StatusSuccess          Status = iota
	StatusOutOfBounds             // the remote range is outside the segment (REM_ACCESS_ABORT)
	StatusBadToken                // the token does not match (REM_ACCESS_ABORT)
	StatusNoPermission            // the segment's access flags forbid it (REM_ACCESS_ABORT)
	StatusReceiverNotReady        // no posted receive at the target (RNR_RETRY_CNT_EXC)
	StatusPeerDead                // the peer's process is gone (ACK_TIMEOUT)
	StatusLocalLength             // a local buffer is too small or out of range (LOC_LEN)
	StatusRemoteLength            // the message exceeds the posted receive (REM_RESP_LEN)
	StatusUnsupported             // the operation is not allowed here (UNSUPPORTED_OPCODE)
	StatusFlushed                 // the queue was closed before the request ran (WR_FLUSH)
	StatusLinkDown                // the path to the peer is down (simulated faults)
	StatusMisaligned              // an atomic's remote word is not 8-byte aligned (REM_OPERATION)
)

var statusNames = [...]string{"success", "out of bounds", "bad token", "no permission",
	"receiver not ready", "peer dead", "local length error", "remote length error",
	"unsupported", "flushed", "link down", "misaligned"}

func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("Status(%d)", uint8(s))
}

// Completion reports a finished work request.
type Completion struct {
	Status  Status
	Op      Opcode
	UserCtx uint64
	// Len is the bytes moved (for a receive: the message length).
	Len int
	Imm uint64
	// HasImm says whether Imm was delivered (SendImm, WriteImm).
	HasImm bool
	// Value is an atomic's previous value.
	Value uint64
}

// Err returns nil for a successful completion, else an error describing it.
func (c Completion) Err() error {
	if c.Status == StatusSuccess {
		return nil
	}
	return &CompletionError{c}
}

// CompletionError is a failed completion as an error.
type CompletionError struct{ Completion Completion }

func (e *CompletionError) Error() string {
	return fmt.Sprintf("ub: %s (ctx %d): %s", e.Completion.Op, e.Completion.UserCtx, e.Completion.Status)
}
