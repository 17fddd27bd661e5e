package faults

import "testing"

func TestParse(t *testing.T) {
	good := map[string]Fault{
		"": {}, "none": {}, "refuse": {Kind: Refuse}, "503": {Kind: Unavailable},
		"cut-after=3": {Kind: CutAfter, N: 3}, "crash-after=0": {Kind: CrashAfter, N: 0},
		"stall": {Kind: Stall}, "no-heartbeat": {Kind: NoHeartbeat}, "draining": {Kind: Draining}, "bad-headers": {Kind: BadHeaders},
	}
	for in, want := range good {
		got, err := Parse(in)
		if err != nil || got != want {
			t.Errorf("Parse(%q) = %v, %v; want %v", in, got, err, want)
		}
		if in != "" {
			if again, _ := Parse(got.String()); again != got {
				t.Errorf("%q does not round-trip: %q", in, got.String())
			}
		}
	}
	for _, bad := range []string{"crash", "cut-after=", "cut-after=-1", "cut-after=x", "504", "STALL"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
}
