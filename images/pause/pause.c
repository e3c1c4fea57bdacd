/*
 * kubeforge pause: the process that holds a pod sandbox's namespaces open.
 *
 * Role: containerd starts it as the first process of every pod on the real test node
 * (sandbox_image in containerd's CRI config). It must (1) stay alive doing nothing,
 * (2) exit promptly and cleanly on SIGINT/SIGTERM so pod teardown is quick, and
 * (3) reap zombies, since it is PID 1 of the pod's PID namespace when sharing is on.
 * Built with `gcc -static` so the image needs no libc.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig) {
    (void)sig;
    _exit(0);
}

static void on_child(int sig) {
    (void)sig;
    int saved = errno;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    errno = saved;
}

static int install(int sig, void (*handler)(int)) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sa.sa_flags = SA_RESTART | (sig == SIGCHLD ? SA_NOCLDSTOP : 0);
    sigemptyset(&sa.sa_mask);
    return sigaction(sig, &sa, NULL);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "-v") == 0) {
        printf("kubeforge-pause 1\n");
        return 0;
    }
    if (getpid() != 1) {
        fprintf(stderr, "kubeforge-pause: warning: not PID 1, children of other processes are not reaped\n");
    }
    if (install(SIGINT, on_stop) || install(SIGTERM, on_stop) || install(SIGCHLD, on_child)) {
        perror("kubeforge-pause: sigaction");
        return 1;
    }
    for (;;) {
        pause();
    }
}
