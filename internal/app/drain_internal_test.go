package app

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
)

// The drain gate: while a request is in flight the gate is not idle and a wait returns only
// when its context ends; the request's end makes it idle; a request served after that
// neither closes the channel again nor blocks a later wait.
func TestDrainGate(t *testing.T) {
	d := newDrainGate()
	release := make(chan struct{})
	entered := make(chan struct{})
	h := d.wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			close(entered)
			<-release
		}
	}))
	served := make(chan struct{})
	go func() {
		defer close(served)
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/slow", nil))
	}()
	<-entered

	ended, cancel := context.WithCancel(context.Background())
	cancel()
	d.wait(ended) // starts the drain; returns only because its context is over
	select {
	case <-d.idle:
		t.Fatal("idle with a request in flight")
	default:
	}
	close(release)
	<-served
	select {
	case <-d.idle:
	default:
		t.Fatal("not idle once the request ended")
	}
	d.wait(context.Background()) // idle: returns at once

	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/fast", nil)) // no second close
	d.wait(context.Background())
}
