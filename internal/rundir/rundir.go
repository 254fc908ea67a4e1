// Package rundir chooses the calling user's private runtime directory:
// where transport keeps its registry of rendezvous sockets and shm keeps the
// records of segment names it could not use (see Dir). Every process of a
// user finds the same directory, and no other user can create it first,
// replace it, or write in it: a directory ubkit uses is a real directory
// (not a symbolic link) owned by the effective user that grants group and
// others no write permission (Check).
//
// It imports nothing of ubkit, so that shm, the bottom layer, can use it.
package rundir

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
)

// Env names a directory that overrides the choice of Dir.
const Env = "UBKIT_RUNTIME_DIR"

// RunUser holds the per-user runtime directories that systemd-logind makes,
// /run/user/<uid>. A variable so that tests can point it elsewhere.
var RunUser = "/run/user"

// SocketPathMax is the longest path of a unix socket (sun_path holds 108
// bytes with the terminating NUL).
const SocketPathMax = 107

// Dir returns this user's runtime directory for ubkit, the first of:
//
//  1. $UBKIT_RUNTIME_DIR;
//  2. $XDG_RUNTIME_DIR/ubkit;
//  3. /run/user/<uid>/ubkit, if /run/user/<uid> is a directory of this user
//     with mode 0700;
//  4. <cache>/ubkit/run (os.UserCacheDir(), $XDG_CACHE_HOME or
//     $HOME/.cache), if it exists: the fallback of step 6, which stays
//     chosen once made;
//  5. <tmp>/ubkit-<uid> (os.TempDir()), unless it exists and is not this
//     user's private directory, or the temporary directory lets other
//     users rename what is in it (writable by them and not sticky);
//  6. <cache>/ubkit/run, which Dir then makes.
//
// Another user can create <tmp>/ubkit-<uid> before this user does (a
// directory, a file or a symbolic link): step 6 makes that harmless. Dir
// creates the directory of steps 5 and 6 (mode 0700) when it chooses it, so
// the choice cannot be taken away afterwards, and decides between them
// under a lock (<cache>/ubkit/run.lock) whenever it must create something,
// so every process of the user agrees on it; the directories of steps 1 to
// 3 are the caller's to create (Ensure). Without a home (no $HOME, or one
// it cannot write to) there is no fallback: Dir uses <tmp>/ubkit-<uid> if it
// can, else it fails. The error says why no directory is usable; the
// returned path is then where the directory was expected.
func Dir() (string, error) { return choose(true) }

// Lookup returns the directory Dir would return, creating nothing: if
// Dir would have to create it, it returns a path that does not exist (and
// so holds nothing).
func Lookup() string {
	dir, _ := choose(false)
	return dir
}

func choose(create bool) (string, error) {
	if d := os.Getenv(Env); d != "" {
		return d, nil
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "ubkit"), nil
	}
	uid := os.Geteuid()
	if base := filepath.Join(RunUser, strconv.Itoa(uid)); Check(base) == nil && mode(base) == 0o700 {
		return filepath.Join(base, "ubkit"), nil
	}
	tmp := filepath.Join(os.TempDir(), "ubkit-"+strconv.Itoa(uid))
	cache, cacheErr := fallback()
	haveCache := func() bool { return cacheErr == nil && Check(cache) == nil }
	if haveCache() {
		return cache, nil
	}
	tmpErr := checkTmp(tmp)
	if tmpErr == nil {
		// Ours, so it stays ours; but a fallback made meanwhile (decided
		// under the lock before tmp was made) wins.
		if haveCache() {
			return cache, nil
		}
		return tmp, nil
	}
	absent := errors.Is(tmpErr, fs.ErrNotExist)
	if !create {
		if !absent && cacheErr == nil {
			return cache, nil
		}
		return tmp, nil
	}
	if cacheErr == nil {
		// The lock for the decision lives beside the fallback.
		cacheErr = mkdirChecked(filepath.Dir(cache))
	}
	if cacheErr != nil {
		// No fallback to agree on (a user whose home is /nonexistent):
		// tmp, if it can be had.
		if !absent {
			return tmp, fmt.Errorf("rundir: %w; and there is no fallback: %w (set HOME, XDG_RUNTIME_DIR or %s)", tmpErr, cacheErr, Env)
		}
		return tmp, mkdirChecked(tmp)
	}
	// Decide under the lock, so that no process chooses tmp while another
	// makes the fallback.
	unlock, err := Lock(cache + ".lock")
	if err != nil {
		return tmp, err
	}
	defer unlock()
	if haveCache() {
		return cache, nil
	}
	tmpErr = checkTmp(tmp)
	if errors.Is(tmpErr, fs.ErrNotExist) {
		tmpErr = mkdirChecked(tmp)
		if !errors.Is(tmpErr, ErrNotPrivate) {
			return tmp, tmpErr // made, or a failure that is no other user's doing
		}
	}
	if tmpErr == nil {
		return tmp, nil
	}
	// Another user's: the fallback, which no other user can create.
	return cache, mkdirChecked(cache)
}

// fallback is the runtime directory used when another user holds
// <tmp>/ubkit-<uid>.
func fallback() (string, error) {
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "ubkit", "run"), nil
}

// checkTmp is Check for <tmp>/ubkit-<uid>, which also needs a temporary
// directory where other users cannot rename it away: one they may not write
// to, or a sticky one.
func checkTmp(dir string) error {
	fi, err := os.Stat(filepath.Dir(dir))
	if err != nil {
		return err
	}
	if fi.Mode().Perm()&0o022 != 0 && fi.Mode()&fs.ModeSticky == 0 {
		return fmt.Errorf("rundir: %s is writable by other users and not sticky, so it cannot hold a private directory: %w",
			filepath.Dir(dir), ErrNotPrivate)
	}
	return Check(dir)
}

// mkdirChecked makes dir with mode 0700 (its parents too) unless it exists,
// then checks it (Check).
func mkdirChecked(dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("rundir: %w", err)
		}
	}
	return Check(dir)
}

// Ensure makes dir and then each of sub, a path below it, unless they
// exist (mode 0700), and checks each (Check).
func Ensure(dir string, sub ...string) error {
	if err := mkdirChecked(dir); err != nil {
		return err
	}
	for _, s := range sub {
		dir = filepath.Join(dir, s)
		if err := mkdirChecked(dir); err != nil {
			return err
		}
	}
	return nil
}

// ErrNotPrivate is wrapped by Check's error for a directory that exists but
// is not this user's private directory.
var ErrNotPrivate = errors.New("not a private directory of this user")

// Check returns nil if dir is a directory, not a symbolic link, owned by the
// effective user, that group and others may not write to. Its error wraps
// fs.ErrNotExist if dir does not exist, else ErrNotPrivate, and says what is
// wrong with it.
func Check(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("rundir: %w", err)
	}
	uid := Owner(fi)
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		return fmt.Errorf("rundir: %s is a symbolic link (owned by uid %d): %w", dir, uid, ErrNotPrivate)
	case !fi.IsDir():
		return fmt.Errorf("rundir: %s is not a directory (owned by uid %d): %w", dir, uid, ErrNotPrivate)
	case uid < 0 || uid != os.Geteuid():
		return fmt.Errorf("rundir: %s belongs to uid %d, not to this user (uid %d): %w", dir, uid, os.Geteuid(), ErrNotPrivate)
	case fi.Mode().Perm()&0o022 != 0:
		return fmt.Errorf("rundir: %s is writable by other users (mode %v): %w", dir, fi.Mode().Perm(), ErrNotPrivate)
	}
	return nil
}

// mode is dir's permission bits, or 0 if it cannot be read.
func mode(dir string) fs.FileMode {
	fi, err := os.Lstat(dir)
	if err != nil {
		return 0
	}
	return fi.Mode().Perm()
}

// CheckSocketPath returns an error if path is too long for a unix socket,
// saying how to make it shorter.
func CheckSocketPath(path string) error {
	if len(path) > SocketPathMax {
		return fmt.Errorf("rundir: socket path %s is %d bytes, more than the %d a unix socket allows: "+
			"set %s to a shorter directory", path, len(path), SocketPathMax, Env)
	}
	return nil
}
