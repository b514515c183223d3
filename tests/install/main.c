/* Links against the installed library and checks two calls that need no GPU. */
#include <anyreduce/anyreduce.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  int version = 0;
  if (anyrGetVersion(&version) != anyrSuccess || version != ANYR_VERSION_CODE) return 1;
  anyrComm_t comm;
  anyrUniqueId id;
  memset(&id, 0, sizeof(id));
  anyrResult_t r = anyrCommInitRank(&comm, 0, id, 0);
  const char* msg = anyrGetLastError(NULL);
  printf("anyreduce %d installed; nranks 0 -> %s: %s\n", version, anyrGetErrorString(r), msg);
  return (r == anyrInvalidArgument && strstr(msg, "'nranks'") != NULL) ? 0 : 2;
}
