package testenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/osproc"
)

// User is an unprivileged user other than the one running the tests: the
// attacker in tests of what another user on the host can do. Run code as it
// with Command.
type User struct {
	Name     string
	UID, GID int
}

// OtherUserEnv names an existing unprivileged uid for OtherUser to use
// instead of creating a throwaway user (for a machine without useradd, or
// tests run by a user that holds CAP_SETUID but is not root).
const OtherUserEnv = "UBKIT_TEST_OTHER_UID"

const (
	// userPrefix starts the name of every throwaway user; the pid of the
	// test process that made it and a counter follow: ubkit-t<pid>-<n>.
	userPrefix = "ubkit-t"
	// binPrefix and homePrefix start the directories, under os.TempDir(),
	// that hold the copy of the test binary and a user's home:
	// <prefix><pid>-<random>.
	binPrefix  = "ubkit-tbin-"
	homePrefix = "ubkit-thome-"
	// A useradd or userdel call that takes longer than this is stuck.
	userCmdTimeout = 60 * time.Second
	// The PATH a command run as the user gets.
	userPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

var (
	// userCount numbers throwaway users within this process; the pid in
	// each name separates processes.
	userCount atomic.Uint64
	// ownUserSweep guards the one sweep that also removes users and
	// directories bearing this process's pid: before it has made any, they
	// can only be left by an earlier process that had the same pid.
	ownUserSweep sync.Once
)

// OtherUser returns a throwaway unprivileged user, created with useradd and
// named ubkit-t<pid>-<n> (no home directory, shell /usr/sbin/nologin, its own
// group), and registers t.Cleanup to remove it with userdel. Before creating
// it, it removes users and files left by test processes that are gone.
//
// If $UBKIT_TEST_OTHER_UID is set, OtherUser returns that existing user
// instead and never removes it. Otherwise it needs root and useradd and
// userdel (Debian package passwd); without them it fails the test, saying so.
// It never skips.
func OtherUser(t testing.TB) *User {
	t.Helper()
	if v := os.Getenv(OtherUserEnv); v != "" {
		u, err := existingUser(v)
		if err != nil {
			t.Fatalf("testenv: %s=%q: %v", OtherUserEnv, v, err)
		}
		return u
	}
	_, addErr := userToolPath("useradd")
	_, delErr := userToolPath("userdel")
	if problem := otherUserProblem(os.Geteuid(), addErr == nil && delErr == nil); problem != "" {
		t.Fatal(problem)
	}
	removed, err := sweepUserLeftovers()
	if len(removed) > 0 {
		t.Logf("testenv: removed users and files left by test processes that are gone: %s", strings.Join(removed, " "))
	}
	if err != nil {
		// Not fatal: leftovers are in no one's way.
		t.Logf("testenv: removing leftover test users: %v", err)
	}
	name := fmt.Sprintf("%s%d-%d", userPrefix, os.Getpid(), userCount.Add(1))
	if _, err := userCmd("useradd", "--no-create-home", "--home-dir", "/nonexistent",
		"--shell", "/usr/sbin/nologin", "--user-group", name); err != nil {
		t.Fatalf("testenv: creating throwaway user %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := deleteUser(name); err != nil {
			t.Errorf("testenv: removing throwaway user %s: %v", name, err)
		}
	})
	u, err := lookupUser(name)
	if err != nil {
		t.Fatalf("testenv: throwaway user %s: %v", name, err)
	}
	if u.UID == 0 || u.UID == os.Geteuid() {
		t.Fatalf("testenv: throwaway user %s got uid %d, which is not another unprivileged user", name, u.UID)
	}
	return u
}

// otherUserProblem says what stops OtherUser from creating a user, or "" if
// nothing does.
func otherUserProblem(euid int, haveTools bool) string {
	if euid != 0 {
		return fmt.Sprintf("testenv: this test runs code as another user: it needs root to create a throwaway user, "+
			"or set %s to an existing unprivileged uid (and hold CAP_SETUID); it runs as uid %d. "+
			"Run `make test` as root", OtherUserEnv, euid)
	}
	if !haveTools {
		return "testenv: this test runs code as another user and creates one with useradd and userdel, " +
			"which are missing (Debian package passwd): run `apt-get install passwd` as root"
	}
	return ""
}

// existingUser is the user $UBKIT_TEST_OTHER_UID names.
func existingUser(v string) (*User, error) {
	uid, err := strconv.Atoi(v)
	if err != nil || uid <= 0 {
		return nil, errors.New("set it to the number of an existing unprivileged uid (not 0)")
	}
	if uid == os.Geteuid() {
		return nil, fmt.Errorf("uid %d is the user running the tests; name another one", uid)
	}
	u := &User{Name: "uid" + v, UID: uid, GID: uid}
	if pw, err := user.LookupId(v); err == nil {
		u.Name = pw.Username
		if gid, err := strconv.Atoi(pw.Gid); err == nil {
			u.GID = gid
		}
	}
	return u, nil
}

// lookupUser reads a user's uid and gid from the user database.
func lookupUser(name string) (*User, error) {
	pw, err := user.Lookup(name)
	if err != nil {
		return nil, err
	}
	uid, err := strconv.Atoi(pw.Uid)
	if err != nil {
		return nil, fmt.Errorf("uid %q: %w", pw.Uid, err)
	}
	gid, err := strconv.Atoi(pw.Gid)
	if err != nil {
		return nil, fmt.Errorf("gid %q: %w", pw.Gid, err)
	}
	return &User{Name: name, UID: uid, GID: gid}, nil
}

// Command returns a command that runs the current test binary as u, with
// -test.run=run and -test.v, so it runs the test functions run selects as u.
// Tell that run it plays the other user with an entry of env ("K=V"): the
// command's environment holds only PATH, HOME (a directory u owns), TMPDIR
// (os.TempDir()), GOMAXPROCS and GORACE if set, and env. It runs with u's uid
// and gid and no supplementary groups, in the directory holding a copy of
// the test binary that u may read and execute (the go command's build
// directory is private), which t.Cleanup removes; the command is killed if it
// still runs when the test ends, and reaped if the test has not waited for
// it.
func (u *User) Command(t testing.TB, run string, env ...string) *exec.Cmd {
	t.Helper()
	exe, err := binaryCopy(t)
	if err != nil {
		t.Fatalf("testenv: copying the test binary for user %s: %v", u.Name, err)
	}
	home, err := u.home(t)
	if err != nil {
		t.Fatalf("testenv: home directory for user %s: %v", u.Name, err)
	}
	cmd := exec.CommandContext(t.Context(), exe, "-test.run="+run, "-test.v")
	cmd.Dir = filepath.Dir(exe)
	cmd.Env = []string{"PATH=" + userPath, "HOME=" + home, "TMPDIR=" + os.TempDir(),
		// A -race binary otherwise waits a second at exit (for late reports).
		"GORACE=" + strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0")}
	if v, ok := os.LookupEnv("GOMAXPROCS"); ok {
		cmd.Env = append(cmd.Env, "GOMAXPROCS="+v)
	}
	cmd.Env = append(cmd.Env, env...)
	if err := osproc.RunAs(cmd, u.UID, u.GID); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	osproc.DieWithParent(cmd)
	t.Cleanup(func() { reap(cmd) })
	return cmd
}

// home makes u a private home directory under os.TempDir() that t.Cleanup
// removes.
func (u *User) home(t testing.TB) (string, error) {
	dir, err := os.MkdirTemp(os.TempDir(), fmt.Sprintf("%s%d-", homePrefix, os.Getpid()))
	if err != nil {
		return "", err
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("testenv: removing %s: %v", dir, err)
		}
	})
	if err := os.Chown(dir, u.UID, u.GID); err != nil {
		return "", err
	}
	return dir, nil
}

// The copy of the test binary is shared by the commands of the tests that
// run at the same time and removed when the last of them ends.
var binCopy struct {
	sync.Mutex
	path  string
	users int
}

// binaryCopy copies the test binary into a new directory that every user
// may read and enter (mode 0755, under os.TempDir()), or returns the copy
// that already exists, and returns the copy's path.
func binaryCopy(t testing.TB) (string, error) {
	binCopy.Lock()
	defer binCopy.Unlock()
	if binCopy.path == "" {
		path, err := copyBinary()
		if err != nil {
			return "", err
		}
		binCopy.path = path
	}
	binCopy.users++
	t.Cleanup(func() {
		binCopy.Lock()
		defer binCopy.Unlock()
		if binCopy.users--; binCopy.users > 0 {
			return
		}
		if err := os.RemoveAll(filepath.Dir(binCopy.path)); err != nil {
			t.Errorf("testenv: removing the copy of the test binary: %v", err)
		}
		binCopy.path = ""
	})
	return binCopy.path, nil
}

func copyBinary() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	src, err := os.Open(exe)
	if err != nil {
		return "", err
	}
	defer src.Close()
	dir, err := os.MkdirTemp(os.TempDir(), fmt.Sprintf("%s%d-", binPrefix, os.Getpid()))
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, filepath.Base(exe))
	err = func() error {
		if err := os.Chmod(dir, 0o755); err != nil {
			return err
		}
		dst, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
		if err != nil {
			return err
		}
		_, err = io.Copy(dst, src)
		return errors.Join(err, dst.Close())
	}()
	if err != nil {
		return "", errors.Join(err, os.RemoveAll(dir))
	}
	return path, nil
}

// SweepUsers removes the throwaway users (ubkit-t<pid>-<n>) and the
// directories holding test binary copies and homes of test processes that
// are no longer alive (killed before their cleanup ran), and returns what it
// removed.
func SweepUsers() (removed []string, err error) {
	return sweepUsers(func(pid int) bool { return !pidAlive(pid) })
}

// sweepUserLeftovers is SweepUsers, and the first time in this process,
// before it makes any user, it also removes those that bear its own pid.
func sweepUserLeftovers() (removed []string, err error) {
	self := os.Getpid()
	swept := false
	ownUserSweep.Do(func() {
		swept = true
		removed, err = sweepUsers(func(pid int) bool { return pid == self || !pidAlive(pid) })
	})
	if swept {
		return removed, err
	}
	return SweepUsers()
}

func sweepUsers(stale func(pid int) bool) (removed []string, err error) {
	var errs []error
	names, err := listUsers()
	if err != nil {
		errs = append(errs, err)
	}
	for _, name := range names {
		pid, ok := parseUserName(name)
		if !ok || !stale(pid) {
			continue
		}
		if err := deleteUser(name); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, name)
	}
	for _, prefix := range []string{binPrefix, homePrefix} {
		dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), prefix+"*"))
		for _, dir := range dirs {
			pidText, _, _ := strings.Cut(strings.TrimPrefix(filepath.Base(dir), prefix), "-")
			pid, err := strconv.Atoi(pidText)
			if err != nil || pid <= 0 || !stale(pid) {
				continue
			}
			if err := os.RemoveAll(dir); err != nil {
				errs = append(errs, err)
				continue
			}
			removed = append(removed, dir)
		}
	}
	return removed, errors.Join(errs...)
}

// parseUserName returns the pid in a name that OtherUser makes,
// ubkit-t<pid>-<n>; ok is false for any other name.
func parseUserName(name string) (pid int, ok bool) {
	rest, ok := strings.CutPrefix(name, userPrefix)
	if !ok {
		return 0, false
	}
	pidText, n, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, false
	}
	if _, err := strconv.ParseUint(n, 10, 64); err != nil {
		return 0, false
	}
	p, err := strconv.ParseUint(pidText, 10, 31)
	if err != nil || p == 0 {
		return 0, false
	}
	return int(p), true
}

// listUsers returns the names of the throwaway users in /etc/passwd.
func listUsers() ([]string, error) {
	data, err := os.ReadFile("/etc/passwd")
	if err != nil {
		return nil, err
	}
	var names []string
	for line := range strings.Lines(string(data)) {
		if name, _, ok := strings.Cut(line, ":"); ok && strings.HasPrefix(name, userPrefix) {
			names = append(names, name)
		}
	}
	return names, nil
}

// deleteUser removes user name and its group. A user that is already gone
// (another process's sweep got there first) is not an error.
func deleteUser(name string) error {
	_, err := userCmd("userdel", name)
	if _, lookErr := user.Lookup(name); isUnknownUser(lookErr) {
		err = nil
	}
	// userdel removes the user's own group when USERGROUPS_ENAB is on (the
	// default); otherwise remove it here.
	if _, lookErr := user.LookupGroup(name); lookErr == nil {
		_, groupErr := userCmd("groupdel", name)
		err = errors.Join(err, groupErr)
	}
	return err
}

func isUnknownUser(err error) bool {
	_, ok := errors.AsType[user.UnknownUserError](err)
	return ok
}

// userCmd runs useradd, userdel or groupdel and returns its standard
// output; its error carries the command line and what the tool wrote to
// standard error. Test processes running at once contend for the lock on
// /etc/passwd and /etc/group, which the tools wait for a while themselves; a
// tool that still could not update the files (exit status 1 or 10) is run
// again, a few times.
func userCmd(tool string, args ...string) ([]byte, error) {
	path, err := userToolPath(tool)
	if err != nil {
		return nil, fmt.Errorf("%s (Debian package passwd) is missing: %w", tool, err)
	}
	const tries = 3
	for try := 1; ; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), userCmdTimeout)
		out, err := exec.CommandContext(ctx, path, args...).Output()
		cancel()
		if err == nil {
			return out, nil
		}
		msg := ""
		exitErr, isExit := errors.AsType[*exec.ExitError](err)
		if isExit {
			msg = strings.TrimSpace(string(exitErr.Stderr))
			if code := exitErr.ExitCode(); try < tries && (code == 1 || code == 10) {
				continue
			}
		}
		return out, fmt.Errorf("%s %s: %w: %s", tool, strings.Join(args, " "), err, msg)
	}
}

// userToolPath finds useradd, userdel or groupdel. Root's $PATH has
// /usr/sbin, but sudo or a minimal environment may not, so the usual places
// are tried too.
func userToolPath(tool string) (string, error) {
	path, err := exec.LookPath(tool)
	if err == nil {
		return path, nil
	}
	for _, dir := range []string{"/usr/sbin", "/sbin"} {
		p := filepath.Join(dir, tool)
		if info, statErr := os.Stat(p); statErr == nil && info.Mode().IsRegular() && info.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", err
}
