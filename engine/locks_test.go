package engine

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// Calls of one session run one at a time; the entry for a session goes
// once no call holds or awaits it.
func TestSessionLocks(t *testing.T) {
	var l sessionLocks
	var wg sync.WaitGroup
	inside, most := 0, 0
	var mu sync.Mutex
	for range 50 {
		wg.Go(func() {
			unlock := l.lock("acme/s1")
			mu.Lock()
			inside++
			most = max(most, inside)
			mu.Unlock()
			time.Sleep(time.Millisecond) // others would get in now
			mu.Lock()
			inside--
			mu.Unlock()
			unlock()
		})
	}
	wg.Wait()
	if most != 1 {
		t.Fatalf("%d calls of one session ran at once", most)
	}
	for i := range 1000 {
		l.lock(fmt.Sprintf("acme/s%d", i))()
	}
	if n := lockCount(&l); n != 0 {
		t.Fatalf("%d locks outlived their calls", n)
	}
	// Another session is not held up by a busy one.
	unlock := l.lock("acme/a")
	l.lock("acme/b")()
	unlock()
}

func lockCount(l *sessionLocks) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.m)
}
