#include <ctrl/ctrl.h>
#include <stdio.h>
int main(void) { printf("ctrl %s\n", ctrl_version()); return 0; }
