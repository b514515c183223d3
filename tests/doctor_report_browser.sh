#!/bin/sh
# anyreduce doctor's report as a person meets it: rendered from a recorded measurement, opened in
# headless Chromium (Debian's `chromium`) at 1280 x 900, with a screenshot of that first screen
# (NAME.png) and of the whole page (NAME-full.png) kept in OUTDIR. Fails when
#   - the page's script did not run to its end (a JavaScript error: it sets data-check="ok" on
#     <body> last), or anything was logged to the console (errors, or the page's own check
#     naming a plot label that overlaps another or is cut off);
#   - the page's headline (<h1 id="verdict">) is not the verdict's first line as
#     `anyreduce doctor --report` prints it;
#   - the verdict or the first thing to do is not within the first screen;
#   - plot labels overlap or are cut off (counted by the page's check on <body>).
# Without chromium it prints SKIPPED and exits 77, which ctest reports as skipped
# (SKIP_RETURN_CODE), never as passed.
# Usage: doctor_report_browser.sh ANYREDUCE MEASUREMENT.json OUTDIR NAME   (OUTDIR absolute)
set -u
A="$1"
MEASUREMENT="$2"
DIR="$3"
NAME="$4"

# ANYR_CHROMIUM names the browser where it is not on the PATH (or, naming nothing, hides it).
browser=""
if [ -n "${ANYR_CHROMIUM:-}" ]; then
  [ -x "$ANYR_CHROMIUM" ] && browser="$ANYR_CHROMIUM"
else
  for b in chromium chromium-browser; do
    if command -v "$b" >/dev/null 2>&1; then
      browser=$(command -v "$b")
      break
    fi
  done
fi
if [ -z "$browser" ]; then
  echo "SKIPPED: chromium is not installed (Debian: apt-get install chromium)"
  exit 77
fi

html="$DIR/$NAME.html"
png="$DIR/$NAME.png"
full="$DIR/$NAME-full.png"
dom="$DIR/$NAME.dom.html"
log="$DIR/$NAME.chromium.log"
profile="$DIR/$NAME.chromium-profile"  # its own profile: nothing read from or written to $HOME
rm -rf "$html" "$png" "$full" "$dom" "$log" "$profile"

if ! out=$("$A" doctor --report "$MEASUREMENT" --html "$html"); then
  echo "FAIL: anyreduce doctor --report $MEASUREMENT failed"
  exit 1
fi
headline=$(printf '%s\n' "$out" | head -n 1)
echo "verdict: $headline"

# chromium FLAGS...: headless, as the test's own user (--no-sandbox: CI runs as root), bounded.
chromium_run() {
  timeout -k 5 120 "$browser" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage \
    --no-first-run --user-data-dir="$profile" "$@"
}
url="file://$html"
chromium_run --window-size=1280,900 --virtual-time-budget=1000 --screenshot="$png" "$url" \
  >/dev/null 2>&1
chromium_run --window-size=1280,6000 --virtual-time-budget=1000 --screenshot="$full" "$url" \
  >/dev/null 2>&1
chromium_run --window-size=1280,900 --enable-logging=stderr --v=0 --dump-dom "$url" \
  >"$dom" 2>"$log"
rm -rf "$profile"

failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
for f in "$png" "$full"; do
  [ -s "$f" ] || fail "no screenshot $f"
done
body=$(grep -o '<body[^>]*>' "$dom" | head -n 1)
echo "page check: $body"
case "$body" in
  *'data-check="ok"'*) ;;
  *) fail "the page's script did not run to its end (a JavaScript error?)" ;;
esac
if grep -E ':CONSOLE[:(]|Uncaught' "$log" >"$log.console"; then
  fail "the page logged to the console:"
  sed 's/^/    /' "$log.console"
fi
rm -f "$log.console"
if [ -z "$headline" ] || ! grep -qF "<h1 id=\"verdict\">$headline</h1>" "$dom"; then
  fail "the page's headline is not the verdict's first line"
fi
for want in 'data-label-overlaps="0"' 'data-labels-clipped="0"' 'data-verdict-in-view="yes"' \
  'data-todo-in-view="yes"'; do
  case "$body" in
    *"$want"*) ;;
    *) fail "page check: expected $want" ;;
  esac
done
echo "screenshots: $png $full"
if [ "$failures" -gt 0 ]; then
  exit 1
fi
echo "ok"
