# shellcheck shell=bash
# The head of a JVM crash report (hs_err_pid*.log): what crashed, where and on which thread, so a test's failure
# shows it without opening the file. Sourced by scripts/vm and scripts/vm-test.

# hs_err_head FILE: the signal and problematic frame, the VM's mode and command line, the crashing thread and its
# stack (native and Java frames), siginfo, the general registers, the code bytes around the faulting pc and the
# CPU features the JVM saw.
hs_err_head() {
    awk '
        /^#  *(SIG[A-Z]+|Internal Error|EXCEPTION_|Out of Memory)/ { print; next }
        /^# Java VM:/ { print; next }
        /^# Problematic frame:/ { print; getline; print; next }
        /^Command Line:/ { print; next }
        /^Current thread / { print; next }
        /^Stack: \[/ { stack = 1; n = 0 }
        stack { if ($0 == "" && n > 2 && ++blank >= 2) { stack = 0; next } if ($0 != "" && n++ < 24) print; next }
        /^siginfo:/ { print; next }
        /^Registers:/ { regs = 5; print; next }
        regs > 0 { print; regs--; next }
        /^Instructions: \(pc=/ { insn = 1; print; next }
        # the faulting line with two lines of code bytes before and after it
        insn && $0 == "" { insn = 0; next }
        insn && index($0, "=>") == 1 { if (p2 != "") print p2; if (p1 != "") print p1; print; after = 2; next }
        insn && after > 0 { print; after--; next }
        insn { p2 = p1; p1 = $0; next }
        /^CPU: total/ { print; next }
    ' "$1"
}
