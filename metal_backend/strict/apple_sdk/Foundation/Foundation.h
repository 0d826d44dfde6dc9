// Stand-in for Apple's <Foundation/Foundation.h>, for metal_backend/strict_check.py:
// declarations only, just what ExecuTorch's Metal runtime headers and our
// runtime/*.mm use, with Apple's documented names and signatures, so that
// clang -x objective-c++ -fobjc-arc -fsyntax-only can read those files off Apple.
#pragma once

#include <stddef.h>
#include <stdint.h>

typedef long NSInteger;
typedef unsigned long NSUInteger;
typedef bool BOOL;  // arm64 macOS
#define YES true
#define NO false
#define nil nullptr

@protocol NSObject
@end

__attribute__((objc_root_class))
@interface NSObject <NSObject>
+ (instancetype)alloc;
+ (instancetype)new;
- (instancetype)init;
@end

@interface NSString : NSObject
+ (nullable instancetype)stringWithUTF8String:(const char* _Nonnull)text;
@property(nullable, readonly) const char* UTF8String __attribute__((objc_returns_inner_pointer));
@end

@interface NSError : NSObject
@property(readonly, copy, nonnull) NSString* localizedDescription;
@end

@interface NSDictionary : NSObject
@end
