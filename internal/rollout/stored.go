package rollout

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// Stored is a rollout as the replicas of a cluster keep it (etcd): the fingerprint of the spec
// it runs (SpecKey) and its state. A replica takes a stored state only for a route whose
// rollout has that fingerprint, so a changed rollout starts again and an unchanged one resumes
// where the fleet left it, whichever replica restarts.
type Stored struct {
	Spec  string `json:"spec"`
	State State  `json:"state"`
}

// MaxStoredBytes bounds a stored rollout as read back: MaxHistory records of the longest
// reasons and figures are about 24 KiB.
const MaxStoredBytes = 32 << 10

// SpecKey is a fingerprint of spec: equal for equal specs, and 128 bits of SHA-256 otherwise.
func SpecKey(spec Spec) string {
	h := sha256.New()
	h.Write([]byte("tlgw rollout spec v1\x00"))
	for _, s := range []string{spec.Canary, spec.Baseline} {
		h.Write(binary.LittleEndian.AppendUint64(nil, uint64(len(s))))
		h.Write([]byte(s))
	}
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(spec.Steps)))
	for _, p := range spec.Steps {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(p))
	}
	b = binary.LittleEndian.AppendUint64(b, uint64(spec.Interval))
	b = binary.LittleEndian.AppendUint64(b, spec.MinRequests)
	for _, f := range []float64{spec.MaxErrorRatio, spec.MaxTTFTP99Ratio, spec.MaxErrorRate} {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(f))
	}
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// Encode is the stored form (JSON).
func (st Stored) Encode() ([]byte, error) {
	b, err := json.Marshal(st)
	if err != nil {
		return nil, err
	}
	if len(b) > MaxStoredBytes {
		return nil, fmt.Errorf("a stored rollout of %d bytes is over the bound of %d", len(b), MaxStoredBytes)
	}
	return b, nil
}

// DecodeStored reads a stored rollout and checks it: bounded, a known status, a step and a
// history within their bounds, a window start for a rollout that runs. Fields it does not
// know are ignored (a newer replica's). Whether the step exists in the route's spec is the
// reader's to check (Fits).
func DecodeStored(b []byte) (Stored, error) {
	if len(b) > MaxStoredBytes {
		return Stored{}, fmt.Errorf("%d bytes, over the bound of %d", len(b), MaxStoredBytes)
	}
	var st Stored
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&st); err != nil {
		return Stored{}, fmt.Errorf("not a stored rollout: %w", err)
	}
	if dec.More() {
		return Stored{}, errors.New("not a stored rollout: more after the object")
	}
	s := st.State
	switch {
	case len(st.Spec) != 32:
		return Stored{}, errors.New("spec: want a 32-digit fingerprint")
	case !slices.Contains([]Status{Running, Paused, Completed, RolledBack, Aborted}, s.Status):
		return Stored{}, fmt.Errorf("status %q is not a rollout's", s.Status)
	case s.Step < 0 || s.Step >= MaxSteps:
		return Stored{}, fmt.Errorf("step %d: want 0 to %d", s.Step, MaxSteps-1)
	case len(s.History) > MaxHistory:
		return Stored{}, fmt.Errorf("%d records, over the bound of %d", len(s.History), MaxHistory)
	case s.Status == Running && s.WindowStart.IsZero():
		return Stored{}, errors.New("a running rollout without a window start")
	}
	if _, err := hex.DecodeString(st.Spec); err != nil {
		return Stored{}, errors.New("spec: want a 32-digit fingerprint")
	}
	return st, nil
}

// Fits reports whether st is a state of spec: its fingerprint, and a step spec has.
func (st Stored) Fits(spec Spec) bool {
	return st.Spec == SpecKey(spec) && st.State.Step < len(spec.Steps)
}

// Clone is s with its own history.
func (s State) Clone() State {
	s.History = slices.Clone(s.History)
	return s
}

// Same reports whether s and o are the same point of a rollout: status, step, window and the
// newest record.
func (s State) Same(o State) bool {
	if s.Status != o.Status || s.Step != o.Step || !s.WindowStart.Equal(o.WindowStart) || len(s.History) != len(o.History) {
		return false
	}
	return len(s.History) == 0 || s.History[len(s.History)-1].At.Equal(o.History[len(o.History)-1].At)
}

// After are the records of s newer than the newest of before (all of them when before has
// none).
func (s State) After(before State) []Record {
	if len(before.History) == 0 {
		return s.History
	}
	last := before.History[len(before.History)-1].At
	for i, r := range s.History {
		if r.At.After(last) {
			return s.History[i:]
		}
	}
	return nil
}

// Counted reports whether a record is a decision tlgw_rollout_decisions_total counts (pause
// and resume are not).
func (r Record) Counted() bool { return r.Decision != Pause && r.Decision != Resume }

// DecideAt is Decide for a window that ended at due and is judged at now (a cluster's decider
// judges once every replica's counts are in): the record and the next window start at due,
// so windows stay back to back, unless the verdict is over an interval late (the decider was
// away), when the next window starts at now.
func (s *State) DecideAt(spec Spec, due, now time.Time, canary, baseline Counts) Record {
	rec := s.Decide(spec, due, canary, baseline)
	if now.Sub(due) >= spec.Interval {
		s.WindowStart = now
	}
	return rec
}
