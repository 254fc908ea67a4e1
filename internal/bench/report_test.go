package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestRunInterleavesAndReports(t *testing.T) {
	var order []string
	contender := func(name string, v float64, err error) Contender {
		return Contender{Name: name, Run: func(d time.Duration) (Measurement, error) {
			order = append(order, name)
			return Measurement{Value: v, Samples: []float64{v, v * 2}}, err
		}}
	}
	cases := []Case{{
		Name: "c1", Unit: "ns/op", Better: "lower", Latency: true,
		Contenders: []Contender{contender("ubkit", 100, nil), contender("uds", 400, nil), contender("broken", 1, errors.New("no such thing"))},
	}}
	rep, err := Run("s", cases, Options{Rounds: 2, Duration: time.Millisecond, Warmup: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// Warm-up once each, then rounds A B A B (the broken one drops out).
	want := "ubkit uds broken ubkit uds ubkit uds"
	if got := strings.Join(order, " "); got != want {
		t.Errorf("order %q, want %q", got, want)
	}
	var buf bytes.Buffer
	if err := rep.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Suite   string `json:"suite"`
		Results []struct {
			Case      string             `json:"case"`
			Unit      string             `json:"unit"`
			Better    string             `json:"better"`
			Value     float64            `json:"value"`
			Baselines map[string]float64 `json:"baselines"`
		} `json:"results"`
	}
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	r := doc.Results[0]
	if doc.Suite != "s" || r.Case != "c1" || r.Unit != "ns/op" || r.Better != "lower" || r.Value != 100 || r.Baselines["uds"] != 400 {
		t.Errorf("unexpected report %s", buf.String())
	}
	if _, ok := r.Baselines["broken"]; ok {
		t.Error("a failed baseline has a value")
	}
	buf.Reset()
	rep.WriteTable(&buf)
	if !strings.Contains(buf.String(), "4.0x faster") || !strings.Contains(buf.String(), "error: no such thing") {
		t.Errorf("table lacks the comparison or the error:\n%s", buf.String())
	}
	if got := rep.Results[0].Compare; len(got) != 1 || got["uds"] != "4.0x faster" {
		t.Errorf("compare = %v, want uds: 4.0x faster and nothing for the failed baseline", got)
	}
}

// TestRunWarmupRounds: a case's warm-up rounds run every contender in
// turn with the run's duration, in place of the short warm-up, and are
// not measured: the value is the measured rounds' alone.
func TestRunWarmupRounds(t *testing.T) {
	var order []string
	runs := map[string]int{}
	contender := func(name string) Contender {
		return Contender{Name: name, Run: func(d time.Duration) (Measurement, error) {
			order = append(order, fmt.Sprintf("%s/%v", name, d))
			runs[name]++
			return Measurement{Value: float64(runs[name])}, nil // 1, 2, ... by run
		}}
	}
	cases := []Case{{Name: "c", Unit: "msg/s", Better: "higher", WarmupRounds: 2, Contenders: []Contender{contender("ubkit"), contender("base")}}}
	rep, err := Run("s", cases, Options{Rounds: 3, Duration: time.Second, Warmup: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Repeat("ubkit/1s base/1s ", 5)
	if got := strings.Join(order, " ") + " "; got != want {
		t.Errorf("order %q, want %q", got, want)
	}
	if st := rep.Results[0].Detail["ubkit"]; st.Median != 4 || st.Min != 3 || st.Max != 5 || st.Rounds != 3 {
		t.Errorf("ubkit's stats %+v: want the measured runs 3, 4, 5 only", st)
	}
}

func TestRunFailsWhenUbkitFails(t *testing.T) {
	_, err := Run("s", []Case{{Name: "c", Contenders: []Contender{{Name: "ubkit", Run: func(time.Duration) (Measurement, error) {
		return Measurement{}, errors.New("boom")
	}}}}}, Options{Rounds: 1})
	if err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("err = %v", err)
	}
}

// TestExtraAndVerdict: a contender's extra figures are kept round by round,
// and a case's verdict sees them and is printed under the table and kept in
// the JSON row.
func TestExtraAndVerdict(t *testing.T) {
	round := 0
	lateness := []float64{5, 9, 7}
	cases := []Case{{
		Name: "c", Unit: "ns", Better: "lower", Latency: true,
		Contenders: []Contender{{Name: "ubkit", Run: func(time.Duration) (Measurement, error) {
			m := Measurement{Value: 100, Samples: []float64{100}, Extra: map[string]float64{"late": lateness[round]}}
			round++
			return m, nil
		}}},
		Verdict: func(r Result) string {
			return fmt.Sprintf("late by up to %v", slices.Max(r.Detail["ubkit"].Extra["late"]))
		},
	}}
	rep, err := Run("s", cases, Options{Rounds: 3})
	if err != nil {
		t.Fatal(err)
	}
	if got := rep.Results[0].Detail["ubkit"].Extra["late"]; !slices.Equal(got, lateness) {
		t.Errorf("extra figures %v, want the rounds' %v", got, lateness)
	}
	var table, doc bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "\nc: late by up to 9\n") {
		t.Errorf("the table lacks the verdict:\n%s", table.String())
	}
	if err := rep.WriteJSON(&doc); err != nil {
		t.Fatal(err)
	}
	var parsed struct {
		Results []struct {
			Verdict string `json:"verdict"`
			Detail  map[string]struct {
				Extra map[string][]float64 `json:"extra"`
			} `json:"detail"`
		} `json:"results"`
	}
	if err := json.Unmarshal(doc.Bytes(), &parsed); err != nil {
		t.Fatal(err)
	}
	if r := parsed.Results[0]; r.Verdict != "late by up to 9" || !slices.Equal(r.Detail["ubkit"].Extra["late"], lateness) {
		t.Errorf("JSON row: %s", doc.String())
	}
}
