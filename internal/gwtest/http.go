package gwtest

import (
	"encoding/json"
	"net/http"
	"testing"
)

// DoJSON sends req with c and decodes the answer's JSON body into out; a transport or decoding
// error fails t.
func DoJSON(t testing.TB, c *http.Client, req *http.Request, out any) {
	t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
}

// GetJSON is DoJSON of a GET of url with the default client.
func GetJSON(t testing.TB, url string, out any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	DoJSON(t, http.DefaultClient, req, out)
}
