package replicaload

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"

	replicav1 "github.com/tlgw/tlgw/contracts/tl/replica/v1"
)

// TestValidateExamples: the doc comment's examples and each bound at and past its limit.
func TestValidateExamples(t *testing.T) {
	id256 := strings.Repeat("i", MaxWorkerIDLen)
	for _, c := range []struct {
		name  string
		table *replicav1.LoadTable
		max   int
		want  []WorkerLoad
		err   string
	}{
		{"doc", tbl("gw-b", "w2:4", "w1:0", "w3:1"), 3, []WorkerLoad{{"w2", 4}, {"w3", 1}}, ""},
		{"doc, w3 renamed w2", tbl("gw-b", "w2:4", "w1:0", "w2:1"), 3, nil, `worker "w2" is listed twice`},
		{"doc, another replica", tbl("gw-c", "w2:4"), 3, nil, `is not "gw-b"`},
		{"a duplicate with no load", tbl("gw-b", "w:0", "w:0"), 3, nil, "listed twice"},
		{"empty", tbl("gw-b"), 0, []WorkerLoad{}, ""},
		{"max entries", tbl("gw-b", "a:1", "b:1"), 2, []WorkerLoad{{"a", 1}, {"b", 1}}, ""},
		{"one over", tbl("gw-b", "a:1", "b:1", "c:1"), 2, nil, "lists 3 workers, over the bound of 2"},
		{"a 256-byte id", tbl("gw-b", id256+":1"), 1, []WorkerLoad{{id256, 1}}, ""},
		{"a 257-byte id", tbl("gw-b", id256+"i:1"), 1, nil, "workers[0]: a worker id is 1 to 256 bytes, not 257"},
		{"an empty id", tbl("gw-b", "a:1", ":1"), 2, nil, "workers[1]: a worker id is 1 to 256 bytes, not 0"},
		{"max in flight", tbl("gw-b", "a:1048576"), 1, []WorkerLoad{{"a", MaxInFlight}}, ""},
		{"one over in flight", tbl("gw-b", "a:1048577"), 1, nil, `workers[0] ("a"): in_flight 1048577 is over the bound of 1048576`},
		{"the largest count", &replicav1.LoadTable{ReplicaId: "gw-b", Workers: []*replicav1.WorkerLoad{{WorkerId: "a", InFlight: math.MaxUint32}}}, 1, nil, "over the bound"},
	} {
		got, err := validate(c.table, "gw-b", c.max)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) || got != nil {
				t.Errorf("%s: %v %v, want an error with %q", c.name, got, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if d := cmp.Diff(c.want, got); d != "" {
			t.Errorf("%s (-want +got):\n%s", c.name, d)
		}
	}
}

// TestSanitizeExample: the doc comment's example, and the ties of the bound broken by id.
func TestSanitizeExample(t *testing.T) {
	got := sanitize([]WorkerLoad{{"b", 3}, {"a", 0}, {"c", 9}, {"b", 5}, {"", 4}, {"d", 1}}, 2)
	if d := cmp.Diff([]WorkerLoad{{"b", 5}, {"c", 9}}, got); d != "" {
		t.Fatalf("(-want +got):\n%s", d)
	}
	got = sanitize([]WorkerLoad{{"z", 1}, {"y", 1}, {"x", 1}}, 2)
	if d := cmp.Diff([]WorkerLoad{{"x", 1}, {"y", 1}}, got); d != "" {
		t.Fatalf("ties (-want +got):\n%s", d)
	}
	if got := sanitize(nil, 2); got == nil || len(got) != 0 {
		t.Fatalf("nothing in flight: %#v, want an empty table (sent, unlike none)", got)
	}
}

// FuzzValidate: validate against its definition written out plainly, on any LoadTable the wire
// can carry; and whatever a router answers, the table a Sharer makes of it is one validate
// accepts with the same entries.
func FuzzValidate(f *testing.F) {
	for _, tb := range []*replicav1.LoadTable{
		tbl("gw", "w2:4", "w1:0", "w3:1"), tbl("gw", "w:1", "w:2"), tbl("gw", ":1"), tbl("x", "w:1"),
		tbl("gw", strings.Repeat("i", MaxWorkerIDLen)+":1048576"), tbl("gw", strings.Repeat("i", MaxWorkerIDLen+1)+":1"),
		tbl("gw", "w:1048577"), tbl("gw"), many("gw", 9),
	} {
		b, err := proto.Marshal(tb)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, "gw", uint8(4))
	}
	f.Fuzz(func(t *testing.T, b []byte, replica string, maxWorkers uint8) {
		var tb replicav1.LoadTable
		if proto.Unmarshal(b, &tb) != nil {
			return
		}
		got, err := validate(&tb, replica, int(maxWorkers))
		ok := tb.GetReplicaId() == replica && len(tb.GetWorkers()) <= int(maxWorkers)
		seen := map[string]bool{}
		want := []WorkerLoad{}
		var loads []WorkerLoad
		for _, w := range tb.GetWorkers() {
			id, n := w.GetWorkerId(), w.GetInFlight()
			loads = append(loads, WorkerLoad{ID: id, InFlight: int64(n)})
			ok = ok && id != "" && len(id) <= MaxWorkerIDLen && n <= MaxInFlight && !seen[id]
			seen[id] = true
			if n > 0 {
				want = append(want, WorkerLoad{ID: id, InFlight: int64(n)})
			}
		}
		slices.SortFunc(want, func(a, b WorkerLoad) int { return strings.Compare(a.ID, b.ID) })
		if ok != (err == nil) {
			t.Fatalf("validate says %v, the definition %v, for %v", err, ok, &tb)
		}
		if ok {
			if d := cmp.Diff(want, got); d != "" {
				t.Fatalf("(-want +got):\n%s", d)
			}
		}

		clean := sanitize(loads, int(maxWorkers))
		partBytes := 1 + int(maxWorkers)*37 // from one entry a part to many
		err = nil
		parts := encode(replica, clean, partBytes)
		var acc []WorkerLoad
		for i, part := range parts {
			if part.GetMore() != (i < len(parts)-1) {
				t.Fatalf("part %d of %d: more %v", i, len(parts), part.GetMore())
			}
			if len(part.Workers) > 1 && proto.Size(part) > partBytes {
				t.Fatalf("part %d of %d entries is %d bytes, over %d", i, len(part.Workers), proto.Size(part), partBytes)
			}
			if acc, err = validatePart(part, replica, int(maxWorkers), acc); err != nil {
				break
			}
		}
		var back []WorkerLoad
		if err == nil {
			back, err = finish(acc)
		}
		if err != nil {
			t.Fatalf("a sanitized table refused: %v", err)
		}
		if d := cmp.Diff(clean, back); d != "" {
			t.Fatalf("a sanitized table changed (-sent +received):\n%s", d)
		}
	})
}
